//! The Helm chart as a platform team ships it: a labelled CRD, kept on uninstall unless told otherwise.
//! (tests/install.rs proves the rendered objects are accepted and the RBAC is right.)
#![allow(clippy::unwrap_used)]

mod common;

use common::chart::{object, render};

#[tokio::test]
async fn the_crd_carries_the_charts_labels_and_is_kept_unless_told_otherwise() {
    let crd_name = "fleetrollouts.fleetroll.dev";
    let objects = render(&[]).await;
    let crd = object(&objects, "CustomResourceDefinition", crd_name).expect("the CRD");
    let labels = &crd["metadata"]["labels"];
    assert_eq!(labels["app.kubernetes.io/instance"], "fr");
    assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm");
    assert_eq!(labels["helm.sh/chart"], "fleetroll-0.1.0");
    assert_eq!(crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep");
    let dropped = render(&["crds.keep=false"]).await;
    let crd = object(&dropped, "CustomResourceDefinition", crd_name).unwrap();
    assert!(crd["metadata"]["annotations"].is_null(), "{}", crd["metadata"]);
    assert_eq!(crd["metadata"]["labels"]["app.kubernetes.io/instance"], "fr");
    let none = render(&["crds.install=false"]).await;
    assert!(object(&none, "CustomResourceDefinition", crd_name).is_none());
}
