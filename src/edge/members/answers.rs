//! Bounds on a member's answers. A member is whatever answers at the address its Secret names, and kube
//! reads a whole answer, or a whole watch event, into memory with no limit of its own: one endless answer
//! would take the operator, and with it every rollout of every namespace, down. So each answer of a member
//! client is counted as it arrives and cut off, as an error, past its bound.

use std::{
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Method, Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use kube::{Client, client::ClientBuilder};
use tower::{BoxError, Service};

const MIB: usize = 1024 * 1024;

/// An answer about one object, and each event of a watch. The API server takes no object larger than
/// 3 MiB; the largest objects the operator reads (Nodes, Pods, workloads) hold a few thousand JSON values.
pub const OBJECT: Bound = Bound { bytes: 4 * MIB, values: 16 * 1024, per_line: false };
/// A page of a list.
pub const LIST: Bound = Bound { bytes: 16 * MIB, values: 128 * 1024, per_line: false };
/// The events of a watch, one JSON document a line, go on for as long as the watch does: each is an object.
pub const WATCH: Bound = Bound { per_line: true, ..OBJECT };

/// How much of an answer may arrive: bytes, and JSON values (each `{`, `[` and `,` outside strings).
/// Values are bounded as well as bytes because decoding multiplies them: `{}` is 2 bytes of JSON and a
/// whole default object once decoded, kilobytes for a Deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    pub bytes: usize,
    pub values: usize,
    /// Counted from each newline on, not in all.
    pub per_line: bool,
}

/// A member's answer that went past its bound.
#[derive(Debug, thiserror::Error)]
#[error("the member's answer went past {limit} {}, so it was cut off", if *.per_line { "in one watch event" } else { "in all" })]
pub struct TooLarge {
    /// "4 MiB", "16384 JSON values".
    limit: String,
    per_line: bool,
}

/// A client for a member, from its configuration, whose answers are bounded. It runs an exec plugin when
/// the configuration has one, so not on an async worker thread.
pub fn client(config: kube::Config) -> kube::Result<Client> {
    Ok(ClientBuilder::try_from(config)?.with_layer(&tower::layer::layer_fn(Bounded)).build())
}

impl Bound {
    /// The bound of an answer to `method uri`, from the request alone.
    pub fn of(method: &Method, uri: &Uri) -> Bound {
        let watch = uri.query().is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        if watch {
            WATCH
        } else if method == Method::GET && is_collection(uri.path()) {
            LIST
        } else {
            OBJECT
        }
    }

    /// The bound once the answer's status is known: an error answer is read whole (kube reads it for its
    /// message), even to a watch, so it is bounded as an object is.
    pub fn of_status(self, status: http::StatusCode) -> Bound {
        if status.is_success() { self } else { OBJECT }
    }
}

/// Whether `path` names a collection (`/api/v1/pods`, `/apis/apps/v1/namespaces/a/deployments`) rather
/// than one object or its subresource. Anything that is not an API path is taken as a collection: the
/// larger bound, still a bound.
fn is_collection(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] | ["apis", _, _version, rest @ ..] => rest,
        _ => return true,
    };
    match rest {
        ["namespaces", _namespace, _resource, more @ ..] => more.is_empty(),
        [_resource, more @ ..] => more.is_empty(),
        [] => true,
    }
}

/// What an answer has used of its bound so far, and where its JSON is (inside a string or not).
#[derive(Debug)]
pub struct Budget {
    bound: Bound,
    /// Bytes and values in all, or since the last newline.
    bytes: usize,
    values: usize,
    in_string: bool,
    escaped: bool,
}

impl Budget {
    pub fn new(bound: Bound) -> Budget {
        Budget { bound, bytes: 0, values: 0, in_string: false, escaped: false }
    }

    /// Counts `chunk`, the next bytes of the answer. Err: the answer went past its bound.
    pub fn take(&mut self, chunk: &[u8]) -> Result<(), TooLarge> {
        for &b in chunk {
            if b == b'\n' && self.bound.per_line {
                // kube splits a watch at every newline, in a string or not.
                self.check()?;
                *self = Budget::new(self.bound);
                continue;
            }
            self.bytes += 1;
            if self.in_string {
                match b {
                    _ if self.escaped => self.escaped = false,
                    b'\\' => self.escaped = true,
                    b'"' => self.in_string = false,
                    _ => {}
                }
            } else {
                match b {
                    b'"' => self.in_string = true,
                    b'{' | b'[' | b',' => self.values += 1,
                    _ => {}
                }
            }
        }
        self.check()
    }

    fn check(&self) -> Result<(), TooLarge> {
        let per_line = self.bound.per_line;
        if self.bytes > self.bound.bytes {
            let limit = format!("{} MiB", self.bound.bytes / MIB);
            return Err(TooLarge { limit, per_line });
        }
        if self.values > self.bound.values {
            return Err(TooLarge { limit: format!("{} JSON values", self.bound.values), per_line });
        }
        Ok(())
    }
}

/// The client's service stack, with each answer counted against the bound of its request.
struct Bounded<S>(S);

impl<S, Req, Res> Service<Request<Req>> for Bounded<S>
where
    S: Service<Request<Req>, Response = Response<Res>>,
    S::Future: Send + 'static,
    Res: Body<Data = Bytes> + Unpin,
    Res::Error: Into<BoxError>,
{
    type Response = Response<BoundedBody<Res>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Req>) -> Self::Future {
        let bound = Bound::of(request.method(), request.uri());
        let answer = self.0.call(request);
        Box::pin(async move {
            let answer = answer.await?;
            let budget = Budget::new(bound.of_status(answer.status()));
            Ok(answer.map(|inner| BoundedBody { inner, budget: Some(budget) }))
        })
    }
}

/// An answer's body, ended with [`TooLarge`] once past its bound.
pub struct BoundedBody<B> {
    inner: B,
    /// None once the bound was passed: nothing more is read.
    budget: Option<Budget>,
}

impl<B> Body for BoundedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let Some(budget) = this.budget.as_mut() else { return Poll::Ready(None) };
        let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
            None => return Poll::Ready(None),
        };
        if let Some(data) = frame.data_ref()
            && let Err(too_large) = budget.take(data)
        {
            this.budget = None;
            return Poll::Ready(Some(Err(too_large.into())));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.budget.is_none() || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        // What the member announces, never more than may still arrive (a reader may allocate for it).
        let mut hint = self.inner.size_hint();
        if let Some(budget) = self.budget.as_ref().filter(|b| !b.bound.per_line) {
            let left = budget.bound.bytes.saturating_sub(budget.bytes) as u64;
            hint.set_upper(hint.upper().map_or(left, |upper| upper.min(left)));
            if hint.lower() > left {
                hint.set_lower(left);
            }
        }
        hint
    }
}

/// The bound a member's answer went past, when that is what `e` (or one of its causes) says.
pub fn cut_off<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e TooLarge> {
    let mut cause = Some(e);
    while let Some(e) = cause {
        if let Some(too_large) = e.downcast_ref::<TooLarge>() {
            return Some(too_large);
        }
        // An io::Error's source is that of the error it wraps, which it skips: look at that one first.
        let wrapped = e.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref);
        cause = match wrapped {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(method: Method, uri: &str) -> Bound {
        Bound::of(&method, &uri.parse().unwrap())
    }

    fn small(bytes: usize, values: usize, per_line: bool) -> Budget {
        Budget::new(Bound { bytes, values, per_line })
    }

    #[test]
    fn lists_get_the_larger_bound_objects_and_writes_the_smaller_and_watches_one_per_event() {
        for uri in [
            "/api/v1/namespaces",
            "/api/v1/namespaces?labelSelector=a%3Db",
            "/api/v1/pods?limit=500",
            "/api/v1/namespaces/team-a/pods",
            "/apis/apps/v1/deployments?limit=500",
            "/apis/apps/v1/namespaces/team-a/deployments?&limit=500&continue=x",
            "/version",
        ] {
            assert_eq!(bound(Method::GET, uri), LIST, "{uri}");
        }
        for (method, uri) in [
            (Method::GET, "/api/v1/namespaces/team-a"),
            (Method::GET, "/api/v1/nodes/node-1"),
            (Method::GET, "/apis/apps/v1/namespaces/team-a/deployments/web"),
            (Method::GET, "/apis/apps/v1/namespaces/team-a/deployments/web/status"),
            (Method::PATCH, "/apis/apps/v1/namespaces/team-a/deployments/web?fieldManager=fleetroll"),
            (Method::DELETE, "/api/v1/namespaces/team-a/pods/web-0"),
            (Method::POST, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"),
        ] {
            assert_eq!(bound(method.clone(), uri), OBJECT, "{method} {uri}");
        }
        for uri in [
            "/apis/apps/v1/deployments?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true",
            "/api/v1/namespaces/a/pods?watch=1",
        ] {
            assert_eq!(bound(Method::GET, uri), WATCH, "{uri}");
        }
        // Only the parameter itself makes a watch.
        assert_eq!(bound(Method::GET, "/api/v1/pods?labelSelector=watch%3Dtrue"), LIST);
        // An error answer is read whole, whatever was asked.
        assert_eq!(WATCH.of_status(http::StatusCode::GONE), OBJECT);
        assert_eq!(LIST.of_status(http::StatusCode::INTERNAL_SERVER_ERROR), OBJECT);
        assert_eq!(LIST.of_status(http::StatusCode::OK), LIST);
    }

    #[test]
    fn bytes_in_all_hold_up_to_the_last_one() {
        let mut budget = small(10, 100, false);
        assert!(budget.take(b"01234").is_ok());
        assert!(budget.take(b"56789").is_ok());
        assert!(budget.take(b"").is_ok());
        let err = budget.take(b"a").unwrap_err();
        assert_eq!(err.to_string(), "the member's answer went past 0 MiB in all, so it was cut off");
        // Newlines reset nothing.
        assert!(small(4, 100, false).take(b"\n\n\n\n\n").is_err());
    }

    #[test]
    fn json_values_are_counted_outside_strings_only() {
        // 2 objects, 1 array, 3 commas: 6 values; the braces, brackets, commas and escaped quotes inside
        // the strings are not values.
        let json = br#"{"a":[1,2],"b":{"c":"{[,\"]}"},"d":"\\"}"#;
        assert!(small(1024, 6, false).take(json).is_ok());
        assert!(small(1024, 5, false).take(json).is_err());
        // A string split across chunks, an escape at a chunk's end.
        let mut budget = small(1024, 1, false);
        for chunk in [b"{\"x".as_slice(), b",,,\\", b"\",,", b"\"}"] {
            assert!(budget.take(chunk).is_ok(), "{:?}", String::from_utf8_lossy(chunk));
        }
        assert!(budget.take(b",").is_err());
        let err = small(1024, 3, false).take(b"[{},{}]").unwrap_err();
        assert_eq!(err.to_string(), "the member's answer went past 3 JSON values in all, so it was cut off");
    }

    #[test]
    fn a_watch_may_go_on_for_ever_in_events_each_within_the_bound() {
        let mut budget = small(8, 2, true);
        for _ in 0..10_000 {
            assert!(budget.take(b"{\"a\":1}\n").is_ok());
        }
        // An event split across chunks is counted whole.
        assert!(budget.take(b"{\"a\":").is_ok());
        assert!(budget.take(b"12}").is_ok());
        assert!(budget.take(b"\n{\"b\"").is_ok());
        let err = budget.take(b":1234").unwrap_err();
        assert_eq!(
            err.to_string(),
            "the member's answer went past 0 MiB in one watch event, so it was cut off"
        );
        // Values too, per event; a newline ends a string as kube splits there.
        let mut budget = small(1024, 2, true);
        assert!(budget.take(b"[[\n[[\n\"[[[\n[[").is_ok());
        assert!(budget.take(b"[").is_err());
    }

    #[test]
    fn a_long_line_inside_one_chunk_is_caught_wherever_it_is() {
        let long = vec![b'x'; 9];
        for chunk in [[b"\n".as_slice(), &long, b"\n"].concat(), [&long[..], b"\n"].concat(), long.clone()] {
            assert!(small(8, 100, true).take(&chunk).is_err(), "{:?}", String::from_utf8_lossy(&chunk));
        }
        let mut budget = small(8, 100, true);
        assert!(budget.take(&[b"12345678\n".as_slice(), b"12345678\n", b"12345678"].concat()).is_ok());
    }

    /// A body that never ends, a MiB at a time.
    fn endless() -> impl Body<Data = Bytes, Error = std::convert::Infallible> + Unpin {
        let chunk = Bytes::from(vec![b' '; MIB]);
        http_body_util::StreamBody::new(futures::stream::repeat_with(move || Ok(Frame::data(chunk.clone()))))
    }

    #[tokio::test]
    async fn an_endless_answer_is_cut_off_at_its_bound_and_named() {
        use http_body_util::BodyExt;
        let mut service = Bounded(tower::service_fn(|_: Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(endless()))
        }));
        let request = Request::get("/api/v1/namespaces/a").body(()).unwrap();
        let answer = service.call(request).await.unwrap();
        assert_eq!(answer.body().size_hint().upper(), Some(OBJECT.bytes as u64));
        let err = answer.into_body().collect().await.expect_err("an endless answer must be cut off");
        let cut = cut_off(err.as_ref()).expect("the bound named in the error");
        assert_eq!(cut.to_string(), "the member's answer went past 4 MiB in all, so it was cut off");
    }

    #[test]
    fn a_cut_off_answer_is_a_refusal_not_a_member_out_of_reach_and_says_so() {
        let too_large = |per_line| TooLarge { limit: "4 MiB".into(), per_line };
        // As kube reports a watch cut off: an io::Error around its own error.
        let nested = kube::Error::Service(Box::new(too_large(true)));
        let e = kube::Error::ReadEvents(std::io::Error::other(nested));
        assert!(!super::super::is_unreachable(&e), "{e:?}");
        let said = super::super::describe(&e);
        assert_eq!(said, "the member's answer went past 4 MiB in one watch event, so it was cut off");
        let e = kube::Error::Service(Box::new(too_large(false)));
        assert!(!super::super::is_unreachable(&e));
        assert_eq!(
            super::super::describe(&e),
            "the member's answer went past 4 MiB in all, so it was cut off"
        );
    }

    #[test]
    fn answers_within_the_bound_read_as_they_came() {
        let answer = BoundedBody {
            inner: http_body_util::Full::new(Bytes::from_static(b"{\"kind\":\"Namespace\"}")),
            budget: Some(Budget::new(OBJECT)),
        };
        let body = futures::executor::block_on(http_body_util::BodyExt::collect(answer)).unwrap();
        assert_eq!(body.to_bytes(), Bytes::from_static(b"{\"kind\":\"Namespace\"}"));
    }
}
