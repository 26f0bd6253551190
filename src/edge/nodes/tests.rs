use serde_json::json;

use super::*;

#[test]
fn an_http_check_can_address_the_node_or_its_pod() {
    let ds: DaemonSet =
        serde_json::from_value(json!({"metadata": {"name": "agent", "namespace": "ops", "uid": "ds"}}))
            .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "agent-x1", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "ds", "controller": true}]},
        "spec": {"nodeName": "n1", "containers": []},
        "status": {"podIP": "10.0.0.7", "hostIP": "192.168.1.1"},
    }))
    .unwrap();
    let view = View { daemonset: Some(ds), nodes: HashMap::new(), pods: vec![pod] };
    assert_eq!(
        view.url_for("http://{podIP}:8080/healthz?pod={pod}&ns={namespace}", "n1"),
        "http://10.0.0.7:8080/healthz?pod=agent-x1&ns=ops"
    );
    assert_eq!(view.url_for("http://{hostIP}:9100/{node}/{name}", "n1"), "http://192.168.1.1:9100/n1/n1");
}
