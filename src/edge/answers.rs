//! Bounds on answers read from API servers. A member cluster is whatever answers at the address its
//! Secret names, and kube reads a whole answer, or a whole watch event, into memory with no limit of its
//! own, then decodes it into the API's types, where an empty `{}` becomes kilobytes: one crafted answer
//! would take the operator, and with it every rollout of every namespace, down. So each answer of a
//! member client is counted as it arrives (bytes, JSON values, JSON objects) and cut off past its bound,
//! and lists ([`crate::edge::lists`]) decode their items one at a time, each checked as one object.

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

/// An answer about one object, each event of a watch, and each item of a list. The API server takes no
/// object larger than 3 MiB, and the objects fleetroll reads (workloads, Nodes, Pods, Namespaces) hold a
/// few dozen to a few hundred JSON objects outside their managed fields, a few hundred to a few thousand
/// values. Decoded into the API's types a JSON object costs at most 3.3 KiB (a `Volume`; twice that as a
/// vector grows), a value of managed fields at most about 630 bytes (a map of one entry): at most about
/// 50 MiB for one answer, whatever a member puts in it.
pub const OBJECT: Bound = Bound { bytes: 4 * MIB, values: 32 * 1024, objects: 4096, per_line: false };
/// A page of a list. Lists ([`crate::edge::lists`]) split a page into its items before anything is
/// decoded, and check each as [`OBJECT`], so only a page's bytes count here; pages are of
/// [`crate::edge::lists::PAGE`] items.
pub const LIST: Bound = Bound { bytes: 32 * MIB, values: usize::MAX, objects: usize::MAX, per_line: false };
/// The events of a watch, one JSON document a line, go on for as long as the watch does: each is an object.
pub const WATCH: Bound = Bound { per_line: true, ..OBJECT };

/// How much of an answer may arrive: bytes; JSON values (each `{`, `[` and `,` outside strings); and JSON
/// objects (each `{`) outside managed fields (`fieldsV1`, which decodes as plain JSON, a few dozen bytes
/// a value). Values and objects are bounded as well as bytes because decoding multiplies them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    pub bytes: usize,
    pub values: usize,
    pub objects: usize,
    /// Counted from each newline on, not in all.
    pub per_line: bool,
}

/// An answer that went past its bound.
#[derive(Debug, thiserror::Error)]
#[error("the answer went past {limit} {scope}, so it was cut off")]
pub struct TooLarge {
    /// "4 MiB", "65536 JSON values", "4096 JSON objects".
    limit: String,
    /// "in all", "in one watch event", "in one item of a list".
    scope: &'static str,
}

impl TooLarge {
    /// A list longer than `limit` items (`scope`: in one page, in one list).
    pub fn items(limit: usize, scope: &'static str) -> TooLarge {
        TooLarge { limit: format!("{limit} items"), scope }
    }

    /// Facts kept past `limit` bytes (`scope`: in one fleet, in one member's cache).
    pub fn bytes(limit: usize, scope: &'static str) -> TooLarge {
        TooLarge { limit: format!("{} MiB of facts", limit / MIB), scope }
    }
}

/// A client for a member, from its configuration, whose answers are bounded. It runs an exec plugin when
/// the configuration has one, so not on an async worker thread.
pub fn client(config: kube::Config) -> kube::Result<Client> {
    Ok(ClientBuilder::try_from(config)?.with_layer(&tower::layer::layer_fn(Bounded)).build())
}

impl Bound {
    /// A whole document of at most `bytes` and `values` JSON values (objects among them).
    pub fn document(bytes: usize, values: usize) -> Bound {
        Bound { bytes, values, objects: values, per_line: false }
    }

    /// Whether `body`, read whole, stays within this bound: counted before it is parsed, since what
    /// decoding costs follows its values, not only its bytes.
    pub fn holds(self, body: &[u8]) -> bool {
        Budget::new(self).take(body).is_ok()
    }

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

/// What an answer has used of its bound so far, and where its JSON is: in a string or not, how deep,
/// whether in managed fields.
#[derive(Debug)]
pub struct Budget {
    bound: Bound,
    /// Bytes, values and objects in all, or since the last newline.
    bytes: usize,
    values: usize,
    objects: usize,
    in_string: bool,
    escaped: bool,
    /// How much of "fieldsV1" the string being read has matched so far (`None` once it differs).
    matched: Option<usize>,
    /// The last string read is the key "fieldsV1", and the next value is its.
    fields_key: bool,
    fields_value: bool,
    /// Open objects and arrays, and the depth at which managed fields started, while inside them.
    depth: usize,
    in_fields: Option<usize>,
}

/// The key whose value is an object's managed fields: plain JSON once decoded (`FieldsV1`).
const FIELDS_KEY: &[u8] = b"fieldsV1";

impl Budget {
    pub fn new(bound: Bound) -> Budget {
        Budget {
            bound,
            bytes: 0,
            values: 0,
            objects: 0,
            in_string: false,
            escaped: false,
            matched: None,
            fields_key: false,
            fields_value: false,
            depth: 0,
            in_fields: None,
        }
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
                self.in_string_byte(b);
                continue;
            }
            match b {
                b'"' => {
                    self.in_string = true;
                    self.matched = Some(0);
                }
                b':' => self.fields_value = std::mem::take(&mut self.fields_key),
                b'{' => {
                    self.values += 1;
                    if self.in_fields.is_none() {
                        if self.fields_value {
                            self.in_fields = Some(self.depth);
                        } else {
                            self.objects += 1;
                        }
                    }
                    self.depth += 1;
                }
                b'[' => {
                    self.values += 1;
                    self.depth += 1;
                }
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.in_fields == Some(self.depth) {
                        self.in_fields = None;
                    }
                }
                b',' => self.values += 1,
                _ => {}
            }
            if !matches!(b, b':' | b' ' | b'\t' | b'\r' | b'\n') {
                self.fields_key = false;
                self.fields_value = false;
            }
        }
        self.check()
    }

    fn in_string_byte(&mut self, b: u8) {
        match b {
            _ if self.escaped => {
                self.escaped = false;
                self.matched = None;
            }
            b'\\' => self.escaped = true,
            b'"' => {
                self.in_string = false;
                self.fields_key = self.matched == Some(FIELDS_KEY.len());
            }
            _ => {
                self.matched = self.matched.filter(|&n| FIELDS_KEY.get(n) == Some(&b)).map(|n| n + 1);
            }
        }
    }

    fn check(&self) -> Result<(), TooLarge> {
        let scope = if self.bound.per_line { "in one watch event" } else { "in all" };
        let limit = if self.bytes > self.bound.bytes {
            format!("{} MiB", self.bound.bytes / MIB)
        } else if self.values > self.bound.values {
            format!("{} JSON values", self.bound.values)
        } else if self.objects > self.bound.objects {
            format!("{} JSON objects", self.bound.objects)
        } else {
            return Ok(());
        };
        Err(TooLarge { limit, scope })
    }
}

/// Checks one item of a list (its JSON) against the bound of one object, before it is decoded.
pub fn check_item(json: &str) -> Result<(), TooLarge> {
    Budget::new(OBJECT).take(json.as_bytes()).map_err(|e| TooLarge { scope: "in one item of a list", ..e })
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
mod tests;
