//! `wasmless dev <dir>` on a Go handler laid out with its templates and data files: they are
//! embedded and readable as on the cluster, and an edit of one in a sub-folder rebuilds.

use super::{Running, free_port, get, wait_for_body, wasmless};
use std::time::{Duration, Instant};

const HANDLER: &str = r#"package handlers

import (
	"embed"
	"net/http"
	"os"
)

//go:embed templates/*.html
var pages embed.FS

var atStart, _ = os.ReadFile("countries.csv")

func Handler(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/page":
		page, _ := pages.ReadFile("templates/index.html")
		w.Write(page)
	case "/start":
		w.Write(atStart)
	default:
		data, err := os.ReadFile("data/today.txt")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Write(data)
	}
}
"#;

#[tokio::test(flavor = "multi_thread")]
async fn dev_serves_the_files_beside_a_handler_and_rebuilds_when_one_changes() {
    let dir = tempfile::tempdir().unwrap();
    let function = dir.path().join("countries");
    std::fs::create_dir_all(function.join("templates")).unwrap();
    std::fs::create_dir_all(function.join("data")).unwrap();
    std::fs::write(function.join("handler.go"), HANDLER).unwrap();
    std::fs::write(function.join("templates/index.html"), "<h1>hi</h1>").unwrap();
    std::fs::write(function.join("countries.csv"), "fr,France\n").unwrap();
    std::fs::write(function.join("data/today.txt"), "monday").unwrap();
    std::fs::write(function.join("secret.txt"), "kept out").unwrap();
    std::fs::write(function.join(".wasmlessignore"), "secret.txt\n").unwrap();
    let port = free_port();
    let admin_port = free_port().to_string();
    let dev = Running::spawn(
        wasmless()
            .args(["dev", "--port", &port.to_string(), "--admin-port", &admin_port])
            .arg(&function)
            .env("WASMLESS_BUILD_CACHE", dir.path().join("cache")),
    );
    let url = |path: &str| format!("http://127.0.0.1:{port}{path}");
    wait_for_body(&url("/page"), "<h1>hi</h1>").await;
    dev.wait_for_stderr("serving countries on");
    assert_eq!(get(&url("/start")).await.unwrap(), (200, "fr,France\n".into()));
    assert_eq!(get(&url("/")).await.unwrap(), (200, "monday".into()));

    std::fs::write(function.join("data/today.txt"), "tuesday").unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while get(&url("/")).await.unwrap().1 != "tuesday" {
        assert!(Instant::now() < deadline, "the edit was never served");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn deploy_and_dev_refuse_a_link_out_of_the_folder_and_name_what_is_too_big() {
    let dir = tempfile::tempdir().unwrap();
    let function = dir.path().join("leaky");
    std::fs::create_dir_all(&function).unwrap();
    std::fs::write(function.join("handler.go"), HANDLER).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", function.join("passwd")).unwrap();
    let output = wasmless().arg("dev").arg(&function).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("outside the handler's folder"), "{stderr}");

    std::fs::remove_file(function.join("passwd")).unwrap();
    std::fs::write(function.join("big.csv"), "x".repeat(600 * 1024)).unwrap();
    let output = wasmless().arg("dev").arg(&function).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("big.csv (614400 bytes)"), "{stderr}");
}
