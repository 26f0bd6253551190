use proptest::prelude::*;

use super::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn ok(body: &str) -> Vec<Sample> {
    parse_answer(200, body.as_bytes()).unwrap_or_else(|e| panic!("{body}: {e}"))
}

fn err(status: u16, body: &str) -> String {
    match parse_answer(status, body.as_bytes()) {
        Ok(samples) => panic!("{body} was read as {samples:?}"),
        Err(e) => e,
    }
}

#[test]
fn a_vector_is_one_sample_per_series() {
    let body = r#"{"status":"success","data":{"resultType":"vector","result":[
        {"metric":{"__name__":"up","job":"web","pod":"web-1"},"value":[1712345678.9,"0.5"]},
        {"metric":{},"value":[1712345678,"1e+06"]}]}}"#;
    let samples = ok(body);
    assert_eq!(
        samples,
        vec![
            Sample { labels: labels(&[("__name__", "up"), ("job", "web"), ("pod", "web-1")]), value: 0.5 },
            Sample { labels: BTreeMap::new(), value: 1e6 },
        ]
    );
    // No series is no data, not an error: the core decides what no data means.
    assert_eq!(ok(r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#), vec![]);
}

#[test]
fn a_scalar_is_one_sample_without_labels() {
    let samples = ok(r#"{"status":"success","data":{"resultType":"scalar","result":[1712345678.123,"1"]}}"#);
    assert_eq!(samples, vec![Sample { labels: BTreeMap::new(), value: 1.0 }]);
    // The fields may come in any order, and extra ones (warnings, stats) are ignored.
    let reordered = r#"{"warnings":["w"],"data":{"result":[17,"2"],"stats":{"x":1},"resultType":"scalar"},
        "status":"success"}"#;
    assert_eq!(ok(reordered), vec![Sample { labels: BTreeMap::new(), value: 2.0 }]);
}

#[test]
fn every_value_of_every_series_of_a_matrix_is_a_sample() {
    let body = r#"{"status":"success","data":{"resultType":"matrix","result":[
        {"metric":{"pod":"a"},"values":[[1,"1"],[2,"2"]]},
        {"metric":{"pod":"b"},"values":[[1,"3"]]},
        {"metric":{"pod":"c"},"values":[]}]}}"#;
    let values: Vec<(String, f64)> =
        ok(body).into_iter().map(|s| (s.labels["pod"].clone(), s.value)).collect();
    assert_eq!(values, vec![("a".into(), 1.0), ("a".into(), 2.0), ("b".into(), 3.0)]);
}

#[test]
fn a_matrix_series_stands_for_its_values_by_its_extremes_and_its_labels_are_not_copied_per_value() {
    let values = (0..5000).map(|i| format!("[{i},\"{}\"]", i % 7)).collect::<Vec<_>>().join(",");
    let long = "x".repeat(100_000);
    let body = format!(
        r#"{{"status":"success","data":{{"resultType":"matrix","result":[
        {{"metric":{{"pod":"{long}"}},"values":[{values}]}},
        {{"metric":{{"pod":"nan"}},"values":[[1,"NaN"],[2,"NaN"]]}},
        {{"metric":{{"pod":"mixed"}},"values":[[1,"NaN"],[2,"4"]]}}]}}}}"#
    );
    let samples = ok(&body);
    let values: Vec<f64> = samples.iter().map(|s| s.value).collect();
    assert_eq!(samples.len(), 4, "two for the long series, one for each other: {values:?}");
    assert_eq!((values[0], values[1]), (0.0, 6.0));
    assert!(values[2].is_nan() && values[3] == 4.0);
}

#[test]
fn nan_and_infinities_are_read_as_prometheus_writes_them() {
    for (text, check) in [
        ("NaN", f64::is_nan as fn(f64) -> bool),
        ("+Inf", |v: f64| v == f64::INFINITY),
        ("Inf", |v: f64| v == f64::INFINITY),
        ("-Inf", |v: f64| v == f64::NEG_INFINITY),
        ("-0.25", |v: f64| v == -0.25),
        ("3.5e-3", |v: f64| v == 0.0035),
    ] {
        let body = format!(
            r#"{{"status":"success","data":{{"resultType":"vector","result":[
            {{"metric":{{}},"value":[1,"{text}"]}}]}}}}"#
        );
        let value = ok(&body)[0].value;
        assert!(check(value), "{text} read as {value}");
    }
    let garbage =
        r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"lots"]}]}}"#;
    let e = err(200, garbage);
    assert!(e.contains("not a number") && !e.contains("lots"), "{e}");
}

#[test]
fn strings_histograms_and_unknown_result_types_are_not_numbers() {
    let e = err(200, r#"{"status":"success","data":{"resultType":"string","result":[1,"hello"]}}"#);
    assert!(e.contains("string") && !e.contains("hello"), "{e}");
    let e = err(200, r#"{"status":"success","data":{"resultType":"streams","result":[]}}"#);
    assert!(e.contains("unknown resultType"), "{e}");
    let histogram = r#"{"status":"success","data":{"resultType":"vector","result":[
        {"metric":{},"histogram":[1,{"count":"3","sum":"2","buckets":[]}]}]}}"#;
    assert!(err(200, histogram).contains("histogram_quantile"));
    let histograms = r#"{"status":"success","data":{"resultType":"matrix","result":[
        {"metric":{},"histograms":[[1,{"count":"3"}]]}]}}"#;
    assert!(err(200, histograms).contains("native histograms"));
    // A result of the wrong shape for its type.
    assert!(err(200, r#"{"status":"success","data":{"resultType":"scalar","result":[]}}"#).contains("match"));
    assert!(
        err(200, r#"{"status":"success","data":{"resultType":"vector","result":[1,"2"]}}"#).contains("match")
    );
    assert!(err(200, r#"{"status":"success","data":{"resultType":"vector"}}"#).contains("no result"));
    assert!(
        err(200, r#"{"status":"success","data":{"resultType":"scalar","result":[1,"2",3]}}"#)
            .contains("not a")
    );
}

#[test]
fn the_backends_own_error_is_kept_short_and_nothing_else_of_a_body_is_echoed() {
    let body =
        r#"{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected identifier"}"#;
    for status in [400, 422, 503] {
        assert_eq!(
            err(status, body),
            format!("HTTP {status} bad_data: 1:5: parse error: unexpected identifier")
        );
    }
    let long = format!(
        r#"{{"status":"error","errorType":"execution","error":"{}\nsecond line"}}"#,
        "x".repeat(1000)
    );
    let e = err(422, &long);
    assert!(e.chars().count() <= 301 && e.starts_with("HTTP 422 execution: xxx") && e.ends_with('…'), "{e}");
    let control = r#"{"status":"error","error":"a\u0000b\r\nc"}"#;
    assert_eq!(err(500, control), "HTTP 500: a b  c");
    assert_eq!(err(503, r#"{"status":"error"}"#), "HTTP 503");
    // A proxy's page, or any other body: the status code only.
    assert_eq!(err(502, "<html><body>secret internal page</body></html>"), "HTTP 502");
    assert_eq!(err(401, ""), "HTTP 401");
    // JSON that is not the API's, with an error status: the status code only, still.
    assert_eq!(err(404, r#"{"message":"no route /api/v1/query"}"#), "HTTP 404");
    // Success JSON with an error status (a misbehaving proxy) is not taken as an answer.
    assert_eq!(
        err(500, r#"{"status":"success","data":{"resultType":"scalar","result":[1,"1"]}}"#),
        "HTTP 500"
    );
}

#[test]
fn malformed_answers_say_where_not_what() {
    for body in [
        "",
        "not json at all: token=hunter2",
        r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":1},"value":[1,"2"]}]}}"#,
        r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"2"]}"#,
        r#"{"status":"success"}"#,
        r#"{"status":"hunter2"}"#,
        r#"["status","success"]"#,
    ] {
        let e = err(200, body);
        assert!(!e.contains("hunter2") && !e.contains("token"), "{body}: {e}");
    }
    assert_eq!(
        err(200, "{}"),
        "the answer is not Prometheus API JSON (unexpected content at line 1, column 2)"
    );
    assert!(err(200, "nope").starts_with("the answer is not Prometheus API JSON (not JSON at line 1"));
}

#[test]
fn at_most_ten_thousand_samples() {
    let series = |n: usize| {
        (0..n).map(|i| format!(r#"{{"metric":{{"i":"{i}"}},"value":[1,"1"]}}"#)).collect::<Vec<_>>().join(",")
    };
    let vector =
        |n| format!(r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#, series(n));
    assert_eq!(ok(&vector(MAX_SAMPLES)).len(), MAX_SAMPLES);
    let e = err(200, &vector(MAX_SAMPLES + 1));
    assert!(e.contains("more than 10000 samples"), "{e}");
    // Refused as it streams, however many more there are.
    assert!(err(200, &vector(3 * MAX_SAMPLES)).contains("more than 10000 samples"));
    let values = (0..MAX_SAMPLES / 2 + 1).map(|i| format!("[{i},\"1\"]")).collect::<Vec<_>>().join(",");
    let matrix = format!(
        r#"{{"status":"success","data":{{"resultType":"matrix","result":[
            {{"metric":{{"a":"1"}},"values":[{values}]}},{{"metric":{{"a":"2"}},"values":[{values}]}}]}}}}"#
    );
    assert!(err(200, &matrix).contains("more than 10000 samples"));
}

proptest! {
    #[test]
    fn no_body_makes_it_panic(status in 0u16..1000, body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_answer(status, &body);
    }

    #[test]
    fn no_near_miss_of_an_answer_makes_it_panic(
        status in prop_oneof![Just(200u16), Just(400), Just(503)],
        kind in prop_oneof![
            Just("vector".to_string()),
            Just("matrix".to_string()),
            Just("scalar".to_string()),
            Just("string".to_string()),
            "[a-z]{0,6}",
        ],
        result in r#"[\[\]{}",:0-9a-zA-Z.+\- ]{0,80}"#,
    ) {
        let body = format!(r#"{{"status":"success","data":{{"resultType":"{kind}","result":{result}}}}}"#);
        let _ = parse_answer(status, body.as_bytes());
    }

    #[test]
    fn error_reasons_stay_short(error in ".{0,2000}", kind in ".{0,200}") {
        let body = serde_json::json!({"status": "error", "errorType": kind, "error": error}).to_string();
        let reason = parse_answer(422, body.as_bytes()).unwrap_err();
        prop_assert!(reason.chars().count() <= REASON_MAX + 1);
        prop_assert!(!reason.chars().any(char::is_control));
    }
}
