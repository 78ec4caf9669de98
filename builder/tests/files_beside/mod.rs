//! Files beside the handler: a Go handler that embeds its templates (`//go:embed`) and reads
//! a data file it ships with `os.ReadFile`, in a package initialiser (run once, at build
//! time, in the snapshot) and per request, built from its folder and served by the runtime
//! as the cluster serves it (its compiled code, whose header says to read the module for its
//! files).

use super::support::*;
use std::path::Path;

const HANDLER: &str = r#"package handlers

import (
	"embed"
	"html/template"
	"net/http"
	"os"
	"strings"
)

//go:embed templates/*.html
var pages embed.FS

var page = template.Must(template.ParseFS(pages, "templates/*.html"))

// Read once, at start-up: the snapshot keeps what it read.
var atStart = mustRead("countries.csv")

func mustRead(name string) string {
	data, err := os.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return string(data)
}

func Handler(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/page":
		page.ExecuteTemplate(w, "index.html", strings.Count(atStart, "\n"))
	case "/now":
		data, err := os.ReadFile("data/countries.csv")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Write(data)
	case "/write":
		if err := os.WriteFile("countries.csv", []byte("changed"), 0o644); err != nil {
			http.Error(w, "refused: "+err.Error(), http.StatusForbidden)
			return
		}
		w.Write([]byte("written"))
	case "/outside":
		if _, err := os.ReadFile("../../../etc/hostname"); err != nil {
			http.Error(w, "refused: "+err.Error(), http.StatusForbidden)
			return
		}
		w.Write([]byte("read outside"))
	case "/ignored":
		_, err := os.Stat("notes.md")
		w.Write([]byte(err.Error()))
	}
}
"#;

fn write_folder(dir: &Path) {
    std::fs::create_dir_all(dir.join("templates")).unwrap();
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("handler.go"), HANDLER).unwrap();
    std::fs::write(
        dir.join("templates/index.html"),
        "{{define \"index.html\"}}<h1>{{.}} countries</h1>{{template \"foot.html\"}}{{end}}",
    )
    .unwrap();
    std::fs::write(
        dir.join("templates/foot.html"),
        "{{define \"foot.html\"}}<footer>ok</footer>{{end}}",
    )
    .unwrap();
    std::fs::write(dir.join("countries.csv"), "fr,France\nde,Germany\nit,Italy\n").unwrap();
    std::fs::write(dir.join("data/countries.csv"), "jp,Japan\n").unwrap();
    std::fs::write(dir.join("notes.md"), "not shipped").unwrap();
    std::fs::write(dir.join(".wasmlessignore"), "# kept out\nnotes.md\n").unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_go_handler_embeds_its_templates_and_reads_its_data_files_at_start_up_and_per_request() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("countries");
    write_folder(&folder);
    let output = dir.path().join("countries.wasm");
    let built = result(&build("go", &folder, &output, &dir.path().join("cache"), &[]));
    let module = std::fs::read(&output).unwrap();
    let files = wasmless_artifact::guest_files::read(&module).unwrap();
    let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "countries.csv",
            "data/countries.csv",
            "templates/foot.html",
            "templates/index.html"
        ],
        "the module carries the files beside the handler, not the ignored ones nor its source"
    );
    let digest = built["digest"].as_str().unwrap().to_string();
    let code = format!("{}.cwasm.lz4", output.display());
    let code_digest = built["code"]["digest"].as_str().unwrap().to_string();
    // As a pod serves it: from the builder's code, the module read for its files.
    let flags = ["--code", &code, "--code-digest", &code_digest];
    let served = Served::start_with(output.to_str().unwrap(), &digest, &[], &flags).await;
    assert_eq!(
        served.get("/page").await,
        (200, "<h1>3 countries</h1><footer>ok</footer>".to_string())
    );
    assert_eq!(served.get("/now").await, (200, "jp,Japan\n".to_string()));
    let (status, body) = served.get("/write").await;
    assert_eq!(status, 403, "the files are read-only: {body}");
    let (status, body) = served.get("/outside").await;
    assert_eq!(status, 403, "nothing outside the files: {body}");
    let (_, body) = served.get("/ignored").await;
    assert!(body.contains("no such file or directory"), "{body}");
}

#[test]
fn a_module_without_files_carries_no_section_and_a_missing_file_fails_the_build_with_gos_words() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("countries");
    write_folder(&folder);
    std::fs::remove_file(folder.join("countries.csv")).unwrap();
    let output = dir.path().join("countries.wasm");
    let failed = build("go", &folder, &output, &dir.path().join("cache"), &[]);
    let stderr = failed_as_the_sources_fault(&failed);
    assert!(
        stderr.contains("panic: open countries.csv: no such file or directory"),
        "{stderr}"
    );

    let single = dir.path().join("hello.go");
    std::fs::write(&single, example("hello-go").source).unwrap();
    result(&build("go", &single, &output, &dir.path().join("cache"), &[]));
    let module = std::fs::read(&output).unwrap();
    assert!(wasmless_artifact::guest_files::read(&module).unwrap().is_empty());
    let marker = wasmless_artifact::guest_files::SECTION.as_bytes();
    assert!(!module.windows(marker.len()).any(|w| w == marker));
}
