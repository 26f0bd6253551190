//! A hostile member cluster: its API server taken over (it holds member-1's serving certificate, so the
//! operator's TLS checks pass) and answering every request with a body that never ends. The operator
//! reads each answer only up to its bound, leaves the member out as one whose answer was refused, and
//! rolls the rest of the fleet; its memory stays within what the chart gives it.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

use super::support::{self, DEADLINE, OPERATOR_ACCOUNT, register, site, spec, tidy, unique};
use crate::common::{
    fleet::{NEXT_IMAGE, READY_IMAGE, phase, with_fleet},
    members::{Member, write_argo_secret},
    operator::{Operator, process_usage},
};
use fleetroll::api::Phase;

/// The chart's memory limit for the operator (charts/fleetroll/values.yaml `resources.limits.memory`).
const CHART_MEMORY_LIMIT: u64 = 256 * 1024 * 1024;
/// What the flood sends at a time.
const CHUNK: usize = 1024 * 1024;

/// A TLS listener on `member`'s address with `member`'s serving certificate that answers each request
/// with `200 OK` and a chunked body of spaces (the start of valid JSON) that never ends.
struct Flood {
    port: u16,
    /// Bytes of bodies written to the operator so far.
    sent: Arc<AtomicU64>,
}

impl Flood {
    async fn start(member: &Member) -> Flood {
        let pki = member.dir.join("pki");
        let certs: Vec<CertificateDer> =
            CertificateDer::pem_file_iter(pki.join("apiserver.crt")).unwrap().map(Result::unwrap).collect();
        let key = PrivateKeyDer::from_pem_file(pki.join("apiserver.key")).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let host = member.server.trim_start_matches("https://").rsplit_once(':').unwrap().0.to_string();
        let listener = TcpListener::bind((host.as_str(), 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let sent = Arc::new(AtomicU64::new(0));
        let counted = sent.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (acceptor, counted) = (acceptor.clone(), counted.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(stream).await else { return };
                    // The request's head, then the flood, until the operator hangs up.
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
                    if tls.write_all(answer).await.is_err() {
                        return;
                    }
                    let chunk =
                        [format!("{CHUNK:x}\r\n").into_bytes(), vec![b' '; CHUNK], b"\r\n".to_vec()].concat();
                    while tls.write_all(&chunk).await.is_ok() {
                        counted.fetch_add(CHUNK as u64, Ordering::Relaxed);
                    }
                });
            }
        });
        Flood { port, sent }
    }

    fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

#[tokio::test]
async fn a_member_answering_without_end_is_cut_off_left_out_and_the_rest_of_the_fleet_rolls() {
    if !support::members_up() {
        return;
    }
    let _shared = support::FREEZE.read().await;
    with_fleet("members-flood", 0, |fleet| async move {
        let team = unique("flood");
        let one = site("member-1", &team, &team, 2, READY_IMAGE, true).await;
        let before = one.state().await;
        register(&fleet, &[&one], OPERATOR_ACCOUNT).await;
        // The prod wave's only cluster is the flood.
        let flood = Flood::start(&one.member).await;
        let host = one.member.server.rsplit_once(':').unwrap().0.to_string();
        let taken_over =
            Member { name: "flood".into(), server: format!("{host}:{}", flood.port), ..one.member.clone() };
        write_argo_secret(&fleet.client, &fleet.ns, &taken_over, "not-a-token", &[("env", "prod")]).await;

        let op = Operator::start(&fleet.ns, &[], &[]);
        fleet.rollout("flooded", spec(NEXT_IMAGE, &team, 1)).await;
        let fr = fleet
            .wait_rollout("flooded", "the rollout to succeed without the flood", DEADLINE, |fr| {
                phase(fr) == Phase::Succeeded
            })
            .await;
        let (rss, _) = process_usage(op.pid());
        let sent = flood.sent();

        let clusters = fr.status.as_ref().and_then(|s| s.clusters.as_ref()).unwrap();
        let left_out = clusters.left_out.iter().find(|t| t.name == "flood");
        let message = left_out.map(|t| t.message.as_str()).unwrap_or_default();
        assert!(message.contains("MiB") && message.contains("cut off"), "{:?}", clusters.left_out);
        // Cut off, so read past its bound; and the operator held no more than its chart allows at any time.
        assert!(rss > 0, "the operator's peak RSS could not be read");
        assert!(rss < CHART_MEMORY_LIMIT, "peak RSS {} MiB after a flood of {} MiB", rss >> 20, sent >> 20);
        eprintln!("flood: {} MiB sent, operator peak RSS {} MiB", sent >> 20, rss >> 20);

        // member-1's targets each changed once.
        for (name, (image, generation)) in one.state().await {
            assert_eq!((image.as_str(), generation), (NEXT_IMAGE, before[&name].1 + 1), "{name}");
        }
        tidy(&[&one]).await;
    })
    .await;
}
