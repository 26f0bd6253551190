//! Hostile member clusters: their API servers taken over (they hold member-1's serving certificate, so the
//! operator's TLS checks pass). One answers every request with a body that never ends; one with a list of
//! 5 million empty objects in 15 MiB (5 million API structs, gigabytes, decoded as kube decodes a page);
//! one with a page of 500 namespaces of 4,000 empty owner references each (each within the bound of one
//! object, 600 MB kept whole). The operator reads each answer only up to its bound, splits a list into its
//! items before decoding any, keeps only what it needs of each, leaves the members out, and rolls the rest
//! of the fleet; its memory stays within what the chart gives it.

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
use fleetroll::api::Phase;
use testkit::{
    fleet::{NEXT_IMAGE, READY_IMAGE, phase, with_fleet},
    members::{Member, write_argo_secret},
    operator::{Operator, process_usage},
};

/// The chart's memory limit for the operator (charts/fleetroll/values.yaml `resources.limits.memory`).
const CHART_MEMORY_LIMIT: u64 = 256 * 1024 * 1024;
/// What the flood sends at a time.
const CHUNK: usize = 1024 * 1024;

/// What a hostile member answers to every request.
#[derive(Clone, Copy)]
enum Answer {
    /// `200 OK` and a chunked body of spaces (the start of valid JSON) that never ends.
    Endless,
    /// `200 OK` and a whole list of 5 million `{}` items.
    Crafted,
    /// `200 OK` and a whole list of 500 namespaces, each with 4,000 `{}` owner references.
    Heavy,
}

/// A TLS listener on `member`'s address with `member`'s serving certificate that answers each request
/// with `answer`.
struct Flood {
    port: u16,
    /// Bytes of bodies written to the operator so far.
    sent: Arc<AtomicU64>,
}

impl Flood {
    async fn start(member: &Member, answer: Answer) -> Flood {
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
        let items = match answer {
            Answer::Heavy => {
                let references = vec!["{}"; 4000].join(",");
                let item =
                    |i| format!(r#"{{"metadata":{{"name":"heavy-{i}","ownerReferences":[{references}]}}}}"#);
                (0..500).map(item).collect::<Vec<_>>().join(",")
            }
            _ => vec!["{}"; 5_000_000].join(","),
        };
        let crafted =
            Arc::new(format!(r#"{{"kind":"List","apiVersion":"v1","metadata":{{}},"items":[{items}]}}"#));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (acceptor, counted, crafted) = (acceptor.clone(), counted.clone(), crafted.clone());
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
                    if let Answer::Crafted | Answer::Heavy = answer {
                        let length = crafted.len();
                        let head = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
                        );
                        if tls.write_all(head.as_bytes()).await.is_ok()
                            && tls.write_all(crafted.as_bytes()).await.is_ok()
                        {
                            counted.fetch_add(length as u64, Ordering::Relaxed);
                        }
                        return;
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
async fn members_answering_without_end_or_with_crafted_lists_cost_a_bounded_memory_and_the_fleet_rolls() {
    if !support::members_up() {
        return;
    }
    let _shared = support::FREEZE.read().await;
    with_fleet("members-flood", 0, |fleet| async move {
        let team = unique("flood");
        let one = site("member-1", &team, &team, 2, READY_IMAGE, true).await;
        let before = one.state().await;
        register(&fleet, &[&one], OPERATOR_ACCOUNT).await;
        // The prod wave's only clusters are the hostile ones.
        let host = one.member.server.rsplit_once(':').unwrap().0.to_string();
        let mut floods = Vec::new();
        let hostile = [("flood", Answer::Endless), ("crafted", Answer::Crafted), ("heavy", Answer::Heavy)];
        for (name, answer) in hostile {
            let flood = Flood::start(&one.member, answer).await;
            let server = format!("{host}:{}", flood.port);
            let taken_over = Member { name: name.into(), server, ..one.member.clone() };
            write_argo_secret(&fleet.client, &fleet.ns, &taken_over, "not-a-token", &[("env", "prod")]).await;
            floods.push(flood);
        }

        let op = Operator::start(&fleet.ns, &[], &[]);
        fleet.rollout("flooded", spec(NEXT_IMAGE, &team, 1)).await;
        let fr = fleet
            .wait_rollout("flooded", "the rollout to succeed without the flood", DEADLINE, |fr| {
                phase(fr) == Phase::Succeeded
            })
            .await;
        let (rss, _) = process_usage(op.pid());
        let sent: u64 = floods.iter().map(Flood::sent).sum();

        // The operator held no more than its chart allows at any time.
        assert!(rss > 0, "the operator's peak RSS could not be read");
        assert!(
            rss < CHART_MEMORY_LIMIT,
            "peak RSS {} MiB after {} MiB of hostile answers",
            rss >> 20,
            sent >> 20
        );
        let clusters = fr.status.as_ref().and_then(|s| s.clusters.as_ref()).unwrap();
        let said = |name: &str| {
            let left_out = clusters.left_out.iter().find(|t| t.name == name);
            left_out.map(|t| t.message.clone()).unwrap_or_default()
        };
        let endless = said("flood");
        assert!(endless.contains("MiB in all, so it was cut off"), "{:?}", clusters.left_out);
        let crafted = said("crafted");
        assert!(crafted.contains("past 500 items in one page of a list"), "{:?}", clusters.left_out);
        // The heavy page was read whole (its namespaces, named and labelled by nothing, give no target).
        assert!(floods[2].sent() > 0, "the heavy member was not read");
        eprintln!("hostile members: {} MiB sent, operator peak RSS {} MiB", sent >> 20, rss >> 20);

        // member-1's targets each changed once.
        for (name, (image, generation)) in one.state().await {
            assert_eq!((image.as_str(), generation), (NEXT_IMAGE, before[&name].1 + 1), "{name}");
        }
        tidy(&[&one]).await;
    })
    .await;
}
