//! Lists read page by page and decoded item by item. kube decodes a whole page into the API's types at
//! once, where an empty `{}` becomes kilobytes. Here a page is first split into its items (slices of the
//! answer, a few bytes each to hold), and each item is checked against the bound of one object
//! ([`answers::check_item`]), decoded, handed on (to keep only what its reader needs) and dropped. So
//! whatever answers, reading a list costs at most one page's bytes and one item's objects at a time, and
//! what is kept of it is bounded by weight; it ends after [`MAX_ITEMS`] items, as a member may answer with
//! continue tokens for ever.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::{Client, Resource, api::ListParams, core::Request};
use serde::{Deserialize, de::DeserializeOwned};
use serde_json::value::RawValue;

use crate::{edge::answers, error::Result};

/// Items asked for per page. Member pages are bounded by [`answers::LIST`].
pub const PAGE: u32 = 500;
/// The most items one list may give: more than any fleet's, far fewer than memory holds.
pub const MAX_ITEMS: usize = 100_000;
/// The most what is kept of one list, or of one member's cache, may weigh (the facts of 100,000 workloads
/// of a few hundred bytes each, [`crate::core::workload::WorkloadFacts::weight`]).
pub const MAX_FACTS_BYTES: usize = 64 * 1024 * 1024;

/// A page as it arrives: its items still JSON.
#[derive(Deserialize)]
struct Page<'a> {
    #[serde(borrow, default)]
    items: Option<Items<'a>>,
    #[serde(default)]
    metadata: ListMeta,
}

/// The items of a page, at most [`PAGE`]: past that the page is refused as it is read, before a slice is
/// held for each of millions of `{}`.
struct Items<'a>(Vec<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Items<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Bounded<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Bounded<'a> {
            type Value = Items<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "at most {PAGE} items")
            }

            fn visit_seq<S: serde::de::SeqAccess<'de>>(self, mut seq: S) -> Result<Items<'a>, S::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<&'a RawValue>()? {
                    if items.len() == PAGE as usize {
                        let refused = format_args!("the answer went past {PAGE} items in one page of a list");
                        return Err(serde::de::Error::custom(refused));
                    }
                    items.push(item);
                }
                Ok(Items(items))
            }
        }
        deserializer.deserialize_seq(Bounded(std::marker::PhantomData))
    }
}

/// Each object of kind `K` in `namespace` (every namespace when None) that `lp` selects, decoded one at a
/// time and handed to `each`; the list's resourceVersion. Err: a request failed, an item was larger than
/// one object may be or did not decode, or the list went on past [`MAX_ITEMS`] (or a page past [`PAGE`]).
pub async fn each<K>(
    client: &Client,
    namespace: Option<&str>,
    lp: &ListParams,
    mut each: impl FnMut(K) -> Result<()>,
) -> Result<Option<String>>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let request = Request::new(K::url_path(&(), namespace));
    let mut lp = lp.clone().limit(PAGE);
    let (mut read, mut version) = (0, None);
    loop {
        let asked = request.list(&lp).map_err(kube::Error::BuildRequest)?;
        let text = client.request_text(asked).await?;
        let page: Page = serde_json::from_str(&text).map_err(kube::Error::SerdeError)?;
        let items = page.items.map(|i| i.0).unwrap_or_default();
        read += items.len();
        if read > MAX_ITEMS {
            return Err(too_long(MAX_ITEMS, "in one list"));
        }
        for item in items {
            answers::check_item(item.get()).map_err(|e| kube::Error::Service(Box::new(e)))?;
            each(serde_json::from_str(item.get()).map_err(kube::Error::SerdeError)?)?;
        }
        // The pages of one list are one snapshot: the first says at which version.
        version = version.or(page.metadata.resource_version.map(bounded).transpose()?);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => lp = lp.continue_token(&bounded(token)?),
            _ => return Ok(version),
        }
    }
}

/// What [`each`] gives, each object cut to what its reader needs (`keep`), in a vector that weighs at
/// most [`MAX_FACTS_BYTES`] (`weight`): a list kept whole would hold every field of every object, as many
/// as a member cares to send.
pub async fn kept<K>(
    client: &Client,
    namespace: Option<&str>,
    lp: &ListParams,
    keep: fn(K) -> K,
    weight: fn(&K) -> usize,
) -> Result<Vec<K>>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let (mut found, mut held) = (Vec::new(), 0);
    each(client, namespace, lp, |k| {
        let k = keep(k);
        held += weight(&k);
        if held > MAX_FACTS_BYTES {
            return Err(too_heavy("in one list"));
        }
        found.push(k);
        Ok(())
    })
    .await?;
    Ok(found)
}

/// The longest continue token or resourceVersion sent back: the API server's are far shorter, and one a
/// member made megabytes long would be copied, percent-encoded, into the next request's URL.
pub const TOKEN_MAX: usize = 4096;

/// `token` (a continue token or a resourceVersion read from an answer) if it may be sent back.
pub fn bounded(token: String) -> Result<String> {
    if token.len() <= TOKEN_MAX {
        return Ok(token);
    }
    let refused = format!("the answer's continue token or resourceVersion is {} bytes long", token.len());
    Err(kube::Error::Service(refused.into()).into())
}

fn too_long(limit: usize, scope: &'static str) -> crate::error::Error {
    kube::Error::Service(Box::new(answers::TooLarge::items(limit, scope))).into()
}

/// The error for what is kept past [`MAX_FACTS_BYTES`] (`scope`: in one list, fleet, member's cache).
pub fn too_heavy(scope: &'static str) -> crate::error::Error {
    kube::Error::Service(Box::new(answers::TooLarge::bytes(MAX_FACTS_BYTES, scope))).into()
}

/// How every cache lists: as a stream of single objects where the API server can (a streaming list,
/// `sendInitialEvents`), so that a list never sits in memory whole, however large what tenants wrote into
/// their objects; otherwise in pages of [`LIST_PAGE`] (the API server answers a list "from its cache", as
/// `resourceVersion=0` asks, in one page whatever the limit, so those are read from etcd).
pub async fn watch_config(client: &Client) -> kube::runtime::watcher::Config {
    use futures::StreamExt;
    use kube::api::WatchEvent;
    let probe = kube::core::Request::new("/apis/apps/v1/deployments")
        .watch(&kube::api::WatchParams::streaming_lists().timeout(1), "")
        .map_err(kube::Error::BuildRequest);
    let streams = match probe {
        Ok(request) => match client.request_events::<k8s_openapi::api::apps::v1::Deployment>(request).await {
            Ok(events) => {
                let first = std::pin::pin!(events).next().await;
                matches!(first, Some(Ok(e)) if !matches!(e, WatchEvent::Error(_)))
            }
            Err(_) => false,
        },
        Err(_) => false,
    };
    if streams {
        tracing::info!("the API server streams lists: every cache lists object by object");
        kube::runtime::watcher::Config::default().streaming_lists()
    } else {
        tracing::info!(page = LIST_PAGE, "the API server does not stream lists: caches list page by page");
        kube::runtime::watcher::Config::default().page_size(LIST_PAGE)
    }
}

/// Objects per page of a cache's list, where lists are not streamed: a page is read whole, so with objects
/// of near-maximal size (1.5 MiB, as etcd allows) a page may cost a few times its count in MiB at once.
const LIST_PAGE: u32 = 5;

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use k8s_openapi::api::core::v1::Namespace;
    use kube::client::Body;
    use serde_json::json;

    use super::*;

    /// A client whose server answers each request with the next of `pages` (the last one again once they
    /// run out), recording what it was asked.
    fn serving(pages: Vec<String>) -> (Client, Arc<Mutex<Vec<String>>>) {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = asked.clone();
        let service = tower::service_fn(move |request: http::Request<Body>| {
            let mut seen = seen.lock().unwrap();
            seen.push(request.uri().to_string());
            let page = pages[(seen.len() - 1).min(pages.len() - 1)].clone();
            async move { Ok::<_, std::convert::Infallible>(http::Response::new(Body::from(page.into_bytes()))) }
        });
        (Client::new(service, "default"), asked)
    }

    fn page(names: &[&str], next: &str) -> String {
        versioned(names, next, "7")
    }

    fn versioned(names: &[&str], next: &str, version: &str) -> String {
        let items: Vec<_> =
            names.iter().map(|n| json!({"metadata": {"name": n, "labels": {"a": "b"}}})).collect();
        let metadata = json!({"resourceVersion": version, "continue": next});
        json!({"kind": "NamespaceList", "apiVersion": "v1", "metadata": metadata, "items": items}).to_string()
    }

    #[tokio::test]
    async fn pages_are_followed_and_items_decoded_one_by_one() {
        let (client, asked) =
            serving(vec![versioned(&["a", "b"], "next-token", "7"), versioned(&["c"], "", "9")]);
        let mut names = Vec::new();
        let version = each(&client, None, &ListParams::default().labels("team=x"), |n: Namespace| {
            names.push(n.metadata.name.unwrap_or_default());
            Ok(())
        })
        .await
        .unwrap();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(version.as_deref(), Some("7"), "the pages are the first page's snapshot");
        let asked = asked.lock().unwrap().clone();
        assert_eq!(asked.len(), 2);
        assert!(
            asked[0].starts_with("/api/v1/namespaces?") && asked[0].contains("limit=500"),
            "{}",
            asked[0]
        );
        assert!(asked[0].contains("labelSelector=team%3Dx"), "{}", asked[0]);
        assert!(asked[1].contains("continue=next-token"), "{}", asked[1]);
        // An empty list may say `items: null`, or nothing of items.
        for empty in [r#"{"metadata":{},"items":null}"#, r#"{"metadata":{}}"#] {
            let (client, _) = serving(vec![empty.into()]);
            let lp = ListParams::default();
            let none = kept(&client, None, &lp, std::convert::identity, |_: &Namespace| 1).await.unwrap();
            assert!(none.is_empty(), "{empty}");
        }
    }

    #[tokio::test]
    async fn a_list_without_end_a_page_longer_than_asked_and_an_item_too_large_are_refused() {
        // Continue tokens for ever: refused past MAX_ITEMS, with the pages asked for counted.
        let names: Vec<String> = (0..PAGE).map(|i| format!("n{i}")).collect();
        let full: Vec<&str> = names.iter().map(String::as_str).collect();
        let (client, asked) = serving(vec![page(&full, "again")]);
        let err = kept(&client, None, &ListParams::default(), std::convert::identity, |_: &Namespace| 1)
            .await
            .unwrap_err();
        assert_eq!(
            crate::edge::members::describe(&kube_error(err)),
            "the answer went past 100000 items in one list, so it was cut off"
        );
        assert_eq!(asked.lock().unwrap().len(), MAX_ITEMS / PAGE as usize + 1);

        let long: Vec<String> = (0..=PAGE).map(|i| format!("n{i}")).collect();
        let long: Vec<&str> = long.iter().map(String::as_str).collect();
        let (client, _) = serving(vec![page(&long, "")]);
        let err = kept(&client, None, &ListParams::default(), std::convert::identity, |_: &Namespace| 1)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("past 500 items in one page of a list"), "{err}");

        // One item of 5,000 empty objects (5,000 API structs once decoded), after a small one.
        let crafted =
            format!(r#"{{"metadata":{{"name":"x","ownerReferences":[{}]}}}}"#, ["{}"; 5000].join(","));
        let body = format!(r#"{{"metadata":{{}},"items":[{{"metadata":{{"name":"a"}}}},{crafted}]}}"#);
        let (client, _) = serving(vec![body]);
        let mut seen = 0;
        let err = each(&client, None, &ListParams::default(), |_: Namespace| {
            seen += 1;
            Ok(())
        })
        .await
        .unwrap_err();
        assert!(err.to_string().contains("past 4096 JSON objects in one item of a list"), "{err}");
        assert_eq!(seen, 1, "the item before it was handed on, the crafted one never decoded");
    }

    #[tokio::test]
    async fn a_continue_token_or_version_too_long_to_send_back_is_refused() {
        let (client, asked) = serving(vec![page(&["a"], &"&".repeat(TOKEN_MAX + 1))]);
        let err = kept(&client, None, &ListParams::default(), std::convert::identity, |_: &Namespace| 1)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("continue token or resourceVersion is 4097 bytes"), "{err}");
        assert_eq!(asked.lock().unwrap().len(), 1, "never sent back");
        let (client, _) = serving(vec![versioned(&["a"], "", &"9".repeat(TOKEN_MAX + 1))]);
        assert!(
            kept(&client, None, &ListParams::default(), std::convert::identity, |_: &Namespace| 1)
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn what_is_kept_of_a_list_weighs_no_more_than_it_may() {
        let names: Vec<String> = (0..PAGE).map(|i| format!("n{i}")).collect();
        let full: Vec<&str> = names.iter().map(String::as_str).collect();
        let (client, asked) = serving(vec![page(&full, "again")]);
        // Each item kept as 1 MiB: the 65th is refused, on the first page.
        let heavy = |_: &Namespace| 1 << 20;
        let err =
            kept(&client, None, &ListParams::default(), std::convert::identity, heavy).await.unwrap_err();
        assert!(err.to_string().contains("past 64 MiB of facts in one list"), "{err}");
        assert_eq!(asked.lock().unwrap().len(), 1);
    }

    fn kube_error(e: crate::error::Error) -> kube::Error {
        match e {
            crate::error::Error::Kube(k) => k,
            other => panic!("not a kube error: {other}"),
        }
    }
}
