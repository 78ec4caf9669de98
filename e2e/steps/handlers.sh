# Go handlers as people write them, on the installed operator and the real builder: Go 1.22
# routing, streams, a package initialiser that fails, which the user reads on status, and
# files shipped beside the handler.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.

# apply_go_function NAME SOURCE: applies a Go Function of SOURCE (as JSON: Go's tabs stay).
apply_go_function() {
  python3 -c 'import json, sys; print(json.dumps({"apiVersion": "wasmless.io/v1alpha1", "kind": "Function", "metadata": {"name": sys.argv[1]}, "spec": {"language": "go", "source": sys.argv[2]}}))' \
    "$1" "$2" | kubectl apply -n "$NS" -f - >/dev/null
}

as_written_settled() { [[ $(fn_field "$1" .status.phase) =~ ^(Ready|Failed)$ ]]; }

go_as_written() {
  step "Go as people write it: Go 1.22 routes with r.PathValue; Server-Sent Events that leave when flushed and a 20 MB export, through the Service; an initialiser's panic is Go's own message and stack on status.buildMessage and in the Event"
  local routes_source panicking_source streaming_source
  routes_source=$(cat <<'GO'
package handlers

import (
	"fmt"
	"net/http"
)

var mux = http.NewServeMux()

func init() {
	mux.HandleFunc("GET /items/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "item %s", r.PathValue("id"))
	})
}

func Handler(w http.ResponseWriter, r *http.Request) { mux.ServeHTTP(w, r) }
GO
)
  panicking_source=$(cat <<'GO'
package handlers

import (
	"net/http"
	"os"
)

var countries = mustRead("countries.csv")

func mustRead(name string) []byte {
	data, err := os.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return data
}

func Handler(w http.ResponseWriter, r *http.Request) { w.Write(countries) }
GO
)
  streaming_source=$(cat <<'GO'
package handlers

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

func Handler(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/export" {
		w.Header().Set("Content-Type", "text/csv")
		row := strings.Repeat("x", 50)
		for i := 0; i < 330000; i++ {
			fmt.Fprintf(w, "%08d,%s\n", i, row)
		}
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for i := 1; i <= 4; i++ {
		fmt.Fprintf(w, "data: event %d\n\n", i)
		w.(http.Flusher).Flush()
		time.Sleep(300 * time.Millisecond)
	}
}
GO
)
  apply_go_function routes "$routes_source"
  apply_go_function countries "$panicking_source"
  apply_go_function streaming "$streaming_source"
  wait_until 600 "routes Ready or Failed" as_written_settled routes
  phase_is routes Ready || fail "routes: $(fn_field routes .status.buildMessage)"
  local url deadline status
  url=$(service_url routes)
  deadline=$((SECONDS + 30))
  until [[ $(get "${url}items/42" 2>/dev/null) == "item 42" ]] || ((SECONDS >= deadline)); do sleep 1; done
  expect_eq "$(get "${url}items/42")" "item 42" "GET /items/42 through a 'GET /items/{id}' route"
  status=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X DELETE "${url}items/42")
  expect_eq "$status" 405 "DELETE on a GET route"

  wait_until 600 "streaming Ready or Failed" as_written_settled streaming
  phase_is streaming Ready || fail "streaming: $(fn_field streaming .status.buildMessage)"
  url=$(service_url streaming)
  wait_for_connections "$url" "streaming's ClusterIP"
  local timing first total
  # curl's time to the first byte and to the last, of a 1.2 s stream of four events.
  timing=$(curl -sN -o /dev/null --max-time 10 -w '%{time_starttransfer} %{time_total}' "${url}events")
  read -r first total <<<"$timing"
  echo "SSE through the Service: first byte at ${first}s, last at ${total}s"
  awk -v f="$first" -v t="$total" 'BEGIN { exit !(f < 0.6 && t >= 0.9) }' ||
    fail "the first event came at ${first}s of a ${total}s stream: it should leave when flushed"
  local size
  size=$(curl -s -o /dev/null --max-time 60 -w '%{http_code} %{size_download}' "${url}export")
  expect_eq "$size" "200 19800000" "a 19.8 MB CSV export at the default memory limit"

  wait_until 600 "countries Ready or Failed" as_written_settled countries
  phase_is countries Failed || fail "countries: phase $(fn_field countries .status.phase), a panicking initialiser built"
  local message events
  message=$(fn_field countries .status.buildMessage)
  echo "buildMessage: $message"
  expect_contains "$message" "panic: open countries.csv: no such file or directory" "status.buildMessage"
  expect_contains "$message" "goroutine 1 [running]:" "status.buildMessage"
  expect_contains "$message" "function/handlers.mustRead" "status.buildMessage"
  events=$(kubectl get events -n "$NS" --field-selector involvedObject.name=countries -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}')
  expect_contains "$events" "panic: open countries.csv: no such file or directory" "the BuildFailed Event"
  kubectl delete fn routes countries streaming -n "$NS" >/dev/null
  ok
}

files_beside() {
  step "Files beside the handler: templates embedded with //go:embed and a data file read with os.ReadFile, from spec.files in folders; served from the pool at zero and from the Function's own pods"
  local source manifest url
  source=$(cat <<'GO'
package handlers

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

var countries = mustRead("countries.csv")

func mustRead(name string) string {
	data, err := os.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return string(data)
}

func Handler(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/page" {
		page.ExecuteTemplate(w, "index.html", strings.Count(countries, "\n"))
		return
	}
	data, err := os.ReadFile("data/" + strings.TrimPrefix(r.URL.Path, "/"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	w.Write(data)
}
GO
)
  manifest=$(python3 -c 'import json, sys; print(json.dumps({"apiVersion": "wasmless.io/v1alpha1", "kind": "Function",
    "metadata": {"name": "gallery"},
    "spec": {"language": "go", "source": sys.argv[1], "scale": {"min": 0},
             "files": {"countries.csv": "fr,France\nde,Germany\n", "templates/index.html": "<h1>{{.}} countries</h1>",
                       "data/today.txt": "monday"}}}))' "$source")
  kubectl apply -n "$NS" -f - <<<"$manifest" >/dev/null
  wait_until 600 "gallery Ready or Failed" as_written_settled gallery
  phase_is gallery Ready || fail "gallery: $(fn_field gallery .status.buildMessage)"
  expect_eq "$(fn_field gallery .status.servedBy)" pool "gallery's status.servedBy"
  url=$(service_url gallery)
  # A new Service: kube-proxy programs its ClusterIP a moment after Ready.
  expect_answer_at "${url}page" "<h1>2 countries</h1>" "the embedded template, from the pool"
  expect_eq "$(get "${url}today.txt")" "monday" "a data file read per request, from the pool"
  expect_contains "$(curl -s --max-time 5 "${url}missing.txt")" "open data/missing.txt: no such file or directory" "a file not shipped"

  kubectl patch fn gallery -n "$NS" --type merge -p '{"spec": {"scale": {"min": 1}}}' >/dev/null
  gallery_has_pods() { served_by_is gallery pods && (($(ready_pods gallery) >= 1)); }
  wait_until 120 "gallery served by its own pods" gallery_has_pods
  # To the pod itself: through the Service, kube-proxy may still send a request to the pool.
  local pod_url
  pod_url="http://$(kubectl get pods -n "$NS" -l wasmless.io/function=gallery,wasmless.io/component=runtime \
    -o 'jsonpath={.items[0].status.podIP}'):8080/"
  expect_answer_at "${pod_url}page" "<h1>2 countries</h1>" "the embedded template, from the Function's pod"
  expect_eq "$(get "${pod_url}today.txt")" "monday" "a data file, from the Function's pod"
  kubectl delete fn gallery -n "$NS" >/dev/null
  ok
}
