//! The `cdi` binary as a user runs it.

use std::process::Command;

fn cdi(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cdi"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn size_prints_the_spec_numbers() {
    let (ok, out, _) = cdi(&["size", "10Gi"]);
    assert!(ok);
    assert!(out.contains("spec.storage        11381663335 B"), "{out}");
    assert!(out.contains("10129244160 B"), "{out}");
    // The largest quantity: a refusal, not an overflow.
    let (ok, _, err) = cdi(&["size", "9223372036854775807"]);
    assert!(!ok);
    assert!(
        err.contains("needs a claim larger than 2^63-1 bytes"),
        "{err}"
    );
}

#[test]
fn crds_print_every_kind_as_yaml_documents() {
    let (ok, out, _) = cdi(&["crds"]);
    assert!(ok);
    assert_eq!(
        out.matches("\nkind: CustomResourceDefinition\n").count(),
        10
    );
    assert_eq!(out.matches("---\n").count(), 10);
}

#[test]
fn import_a_qcow2_and_explain_a_too_small_size() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img.qcow2");
    let status = Command::new("qemu-img")
        .args(["create", "-f", "qcow2"])
        .arg(&image)
        .arg("100M")
        .status()
        .unwrap();
    assert!(status.success());
    let dest = dir.path().join("disk.img");
    let (ok, out, err) = cdi(&[
        "import",
        "--source",
        image.to_str().unwrap(),
        "--size",
        "1Gi",
        dest.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("format:       qcow2"), "{out}");
    assert_eq!(
        std::fs::metadata(&dest).unwrap().len(),
        1 << 30,
        "grown to the usable size of a spec.storage 1Gi claim"
    );

    let (ok, _, err) = cdi(&[
        "import",
        "--source",
        image.to_str().unwrap(),
        "--size",
        "50Mi",
        "--pvc-api",
        dest.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(
        err.contains("a larger PVC is required: image virtual size 104857600 > usable"),
        "{err}"
    );
    assert_eq!(
        std::fs::metadata(&dest).unwrap().len(),
        1 << 30,
        "a failed import leaves the image that was there"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        2,
        "no leftovers"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn import_from_a_url() {
    let dir = tempfile::tempdir().unwrap();
    let data = cdi_testkit::images::pattern(3 << 20);
    let server = cdi_testkit::FileServer::start(None).await;
    server.add(
        "/disk.raw",
        data.clone(),
        cdi_testkit::Behaviour {
            ranges: true,
            ..Default::default()
        },
    );
    let dest = dir.path().join("disk.img");
    let url = server.url("/disk.raw");
    let args = [
        "import",
        "--source",
        url.as_str(),
        "--header",
        "X-A: b",
        dest.to_str().unwrap(),
    ]
    .map(String::from);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_cdi"))
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("format:       raw"));
    assert_eq!(std::fs::read(&dest).unwrap(), data);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_proxy_environment_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let data = cdi_testkit::images::pattern(1 << 20);
    let proxy = cdi_testkit::FileServer::start(None).await;
    proxy.add(
        "/disk.raw",
        data.clone(),
        cdi_testkit::Behaviour {
            ranges: true,
            ..Default::default()
        },
    );
    let dest = dir.path().join("disk.img");
    let proxy_url = format!("http://{}", proxy.addr());
    let args = [
        "import",
        "--source",
        "http://images.invalid/disk.raw",
        dest.to_str().unwrap(),
    ]
    .map(String::from);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_cdi"))
            .args(&args)
            .env("http_proxy", proxy_url)
            .env_remove("no_proxy")
            .env_remove("NO_PROXY")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&dest).unwrap(), data);
    assert!(
        proxy.log().iter().all(|l| l.proxied),
        "every request went through the proxy"
    );
}
