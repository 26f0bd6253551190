use super::*;

fn bound(method: Method, uri: &str) -> Bound {
    Bound::of(&method, &uri.parse().unwrap())
}

fn small(bytes: usize, values: usize, per_line: bool) -> Budget {
    Budget::new(Bound { bytes, values, objects: usize::MAX, per_line })
}

fn objects(objects: usize) -> Budget {
    Budget::new(Bound { bytes: usize::MAX, values: usize::MAX, objects, per_line: false })
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
    assert_eq!(err.to_string(), "the answer went past 0 MiB in all, so it was cut off");
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
    assert_eq!(err.to_string(), "the answer went past 3 JSON values in all, so it was cut off");
}

#[test]
fn objects_are_counted_outside_managed_fields_which_decode_as_plain_json() {
    // 3 objects (the item, metadata, one managed-fields entry); fieldsV1's 4 are plain JSON.
    let item = br#"{"metadata":{"managedFields":[{"fieldsV1":{"f:spec":{"f:a":{},"f:b":{}},"x":{}}}]}}"#;
    assert!(objects(3).take(item).is_ok());
    assert!(objects(2).take(item).is_err());
    // Objects after managed fields count again, at every depth.
    let after = br#"{"a":{"fieldsV1":{"b":{}}},"c":{},"d":[{},{}]}"#;
    assert!(objects(5).take(after).is_ok());
    assert!(objects(4).take(after).is_err());
    // Only the key itself, followed by a colon, and only an object as its value: otherwise every object
    // counts (an escaped key, which decodes as "fieldsV1", is counted too: more, never fewer).
    for not_fields in [
        br#"{"fieldsV2":{"x":{}}}"#.as_slice(),
        br#"{"xfieldsV1":{"x":{}}}"#,
        br#"{"fieldsV1x":{"x":{}}}"#,
        br#"{"a":"fieldsV1","b":{"x":{}}}"#,
        br#"["fieldsV1",{"x":{}}]"#,
        br#"{"fields\u0056\u0031":{"x":{}}}"#,
    ] {
        let mut budget = objects(usize::MAX);
        budget.take(not_fields).unwrap();
        let all = not_fields.iter().filter(|b| **b == b'{').count();
        assert_eq!(budget.objects, all, "{}", String::from_utf8_lossy(not_fields));
    }
    // Split anywhere, the count is the same.
    for at in 0..item.len() {
        let mut budget = objects(3);
        assert!(budget.take(&item[..at]).is_ok() && budget.take(&item[at..]).is_ok(), "split at {at}");
        assert_eq!(budget.objects, 3);
    }
    let err = objects(2).take(b"[{},{},{}]").unwrap_err();
    assert_eq!(err.to_string(), "the answer went past 2 JSON objects in all, so it was cut off");
    let item = format!("[{}]", ["{}"; 4097].join(","));
    assert_eq!(
        check_item(&item).unwrap_err().to_string(),
        "the answer went past 4096 JSON objects in one item of a list, so it was cut off"
    );
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
    assert_eq!(err.to_string(), "the answer went past 0 MiB in one watch event, so it was cut off");
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
    assert_eq!(cut.to_string(), "the answer went past 4 MiB in all, so it was cut off");
}

#[test]
fn a_cut_off_answer_is_a_refusal_not_a_member_out_of_reach_and_says_so() {
    let too_large = |scope| TooLarge { limit: "4 MiB".into(), scope };
    // As kube reports a watch cut off: an io::Error around its own error.
    let nested = kube::Error::Service(Box::new(too_large("in one watch event")));
    let e = kube::Error::ReadEvents(std::io::Error::other(nested));
    assert!(!crate::edge::members::is_unreachable(&e), "{e:?}");
    let said = crate::edge::members::describe(&e);
    assert_eq!(said, "the answer went past 4 MiB in one watch event, so it was cut off");
    let e = kube::Error::Service(Box::new(too_large("in all")));
    assert!(!crate::edge::members::is_unreachable(&e));
    assert_eq!(crate::edge::members::describe(&e), "the answer went past 4 MiB in all, so it was cut off");
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
