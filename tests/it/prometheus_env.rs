//! The Prometheus of the test environment (crates/fleetroll-testkit/src/prometheus.rs), which the metric gates' tests rely
//! on: a real Prometheus scraping the exporter a test controls gives back the rates and error ratios the
//! test set, refuses requests without the credentials or the CA, and keeps its data across an outage.
//! No cluster needed.

use std::time::Duration;

use testkit::prometheus::{
    ERRORS, Exporter, Options, PASSWORD, Prometheus, QueryError, REQUESTS, USER, by_label,
};

fn assert_close(got: f64, want: f64, relative: f64, what: &str) {
    assert!(
        (got - want).abs() <= want.abs() * relative,
        "{what}: got {got}, want {want} ± {}%",
        relative * 100.0
    );
}

#[tokio::test]
async fn rates_and_error_ratios_are_what_the_exporter_was_set_to() {
    let exporter = Exporter::start();
    exporter.set_rate("shop", "web", 100.0, 0.02);
    exporter.set_rate("shop", "api", 40.0, 0.5);
    let prometheus = Prometheus::start(&exporter, Options::default()).await;
    // rate() is only the set rate once a whole [5s] window lies after the counter's start and holds 5
    // samples (scrapes are 1 s apart): 7 samples in all guarantee both.
    prometheus.wait_for_series(&format!("min(count_over_time({REQUESTS}[1h])) >= 7")).await;

    let ratio =
        format!("sum by (deployment) (rate({ERRORS}[5s])) / sum by (deployment) (rate({REQUESTS}[5s]))");
    let ratios = by_label(&prometheus.query(&ratio).await.unwrap(), "deployment");
    assert_eq!(ratios.len(), 2, "{ratios:?}");
    // Both counters of a deployment are read at the same instant of each scrape, so the ratio is exact.
    assert_close(ratios["web"], 0.02, 1e-6, "web's error ratio");
    assert_close(ratios["api"], 0.5, 1e-6, "api's error ratio");
    let rates = by_label(
        &prometheus.query(&format!("sum by (deployment) (rate({REQUESTS}[5s]))")).await.unwrap(),
        "deployment",
    );
    // Samples carry the time the scrape was scheduled, values the time it was served: a few ms apart
    // (measured: within 0.05%, with the CPUs busy).
    assert_close(rates["web"], 100.0, 0.02, "web's request rate");
    assert_close(rates["api"], 40.0, 0.02, "api's request rate");

    exporter.remove("shop", "api");
    testkit::poll_until("api's series to go stale", Duration::from_secs(10), || {
        let prometheus = &prometheus;
        async move { !by_label(&prometheus.query(REQUESTS).await.unwrap(), "deployment").contains_key("api") }
    })
    .await;
    let left = by_label(&prometheus.query(REQUESTS).await.unwrap(), "deployment");
    assert_eq!(left.keys().collect::<Vec<_>>(), ["web"], "only api was removed");
}

#[tokio::test]
async fn basic_auth_and_tls_guard_the_api() {
    let exporter = Exporter::start();
    exporter.set_rate("shop", "web", 10.0, 0.1);
    let prometheus = Prometheus::start(&exporter, Options { basic_auth: true, tls: true }).await;
    assert!(prometheus.address().starts_with("https://127.0.0.1:"), "{}", prometheus.address());
    assert!(prometheus.ca_pem().unwrap().starts_with("-----BEGIN CERTIFICATE-----"));

    let url = format!("{}/api/v1/query", prometheus.address());
    let form = [("query", "up")];
    let anonymous = prometheus.http().post(&url).form(&form).send().await.unwrap();
    assert_eq!(anonymous.status(), 401, "no credentials");
    let wrong =
        prometheus.http().post(&url).basic_auth(USER, Some("not-it")).form(&form).send().await.unwrap();
    assert_eq!(wrong.status(), 401, "a wrong password");
    let right =
        prometheus.http().post(&url).basic_auth(USER, Some(PASSWORD)).form(&form).send().await.unwrap();
    assert_eq!(right.status(), 200, "the right password");
    match prometheus.query(REQUESTS).await {
        Ok(_) => {}
        Err(e) => panic!("query with the credentials and the CA: {e:?}"),
    }

    // Without the CA (what a Secret's ca.crt must carry) the TLS handshake fails.
    let untrusting = reqwest::Client::builder().build().unwrap();
    let refused = untrusting.post(&url).basic_auth(USER, Some(PASSWORD)).form(&form).send().await;
    assert!(refused.is_err(), "a client without the CA got an answer: {refused:?}");

    // Scraping is unaffected: the exporter's series arrive.
    prometheus.wait_for_series(&format!("{REQUESTS}{{namespace=\"shop\",deployment=\"web\"}}")).await;
}

#[tokio::test]
async fn data_survives_a_stop_and_a_start_again() {
    let exporter = Exporter::start();
    exporter.set_rate("shop", "web", 10.0, 0.0);
    let mut prometheus = Prometheus::start(&exporter, Options { basic_auth: true, tls: false }).await;
    let (address, everything) = (prometheus.address(), format!("{REQUESTS}[1h]"));
    prometheus.wait_for_series(&format!("count_over_time({REQUESTS}[1h]) >= 2")).await;
    let before = prometheus.query(&everything).await.unwrap()[0]["values"].as_array().unwrap().clone();

    prometheus.stop();
    match prometheus.query(REQUESTS).await {
        Err(QueryError::Unreachable(e)) => assert!(e.is_connect(), "not a refused connection: {e:?}"),
        other => panic!("a stopped Prometheus answered: {other:?}"),
    }

    prometheus.start_again().await;
    assert_eq!(prometheus.address(), address, "started again elsewhere");
    let after = prometheus.query(&everything).await.unwrap();
    let after = after[0]["values"].as_array().unwrap();
    for sample in &before {
        assert!(
            after.contains(sample),
            "{sample} was scraped before the stop and is gone after it: {after:?}"
        );
    }
    // And scraping goes on.
    prometheus.wait_for_series(&format!("count_over_time({REQUESTS}[1h]) > {}", after.len())).await;
}
