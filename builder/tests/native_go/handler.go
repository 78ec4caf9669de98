package handlers

// Handlers as people write them for native Go, without reading Wasmless's docs: a JSON
// API, a webhook signature check, a template, gzip, time zones, a large upload, an
// outbound call with a timeout, a status of one's own, Go 1.22's ServeMux patterns,
// Server-Sent Events flushed one by one, and a 21 MB CSV export written row by row.

import (
	"compress/gzip"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// Routes as Go 1.22 writes them: a method, a wildcard read with PathValue, and a 405 with
// an Allow header for the other methods. Under an older go.mod's semantics these are
// literal paths, and every request is a 404.
var items = func() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /items/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "item %s", r.PathValue("id"))
	})
	mux.HandleFunc("GET /items/{id}/files/{path...}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "item %s, file %s", r.PathValue("id"), r.PathValue("path"))
	})
	return mux
}()

var page = template.Must(template.New("page").Parse(
	`<h1>Hello, {{.Name}}</h1><ul>{{range .Items}}<li>{{.}}</li>{{end}}</ul>`))

func Handler(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/items/") {
		items.ServeHTTP(w, r)
		return
	}
	switch r.URL.Path {
	case "/json":
		var in struct {
			Name  string `json:"name"`
			Count int    `json:"count"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"greeting": "hi " + in.Name, "double": in.Count * 2})
	case "/webhook":
		body, _ := io.ReadAll(r.Body)
		mac := hmac.New(sha256.New, []byte(os.Getenv("WEBHOOK_KEY")))
		mac.Write(body)
		if !hmac.Equal([]byte(hex.EncodeToString(mac.Sum(nil))), []byte(r.Header.Get("X-Signature"))) {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(w, "verified %d bytes", len(body))
	case "/template":
		page.Execute(w, map[string]any{"Name": r.URL.Query().Get("name"), "Items": []string{"a", "<b>"}})
	case "/gzip":
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Content-Type", "text/plain")
		gz := gzip.NewWriter(w)
		gz.Write([]byte(strings.Repeat("compressible ", 200)))
		gz.Close()
	case "/timezone":
		loc, err := time.LoadLocation("America/New_York")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC).In(loc).Format(time.RFC1123Z))
	case "/upload":
		hash := sha256.New()
		n, err := io.Copy(hash, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d bytes, sha256 %x", n, hash.Sum(nil))
	case "/call":
		client := &http.Client{Timeout: 2 * time.Second}
		resp, err := client.Post(os.Getenv("UPSTREAM")+"/echo", "text/plain", strings.NewReader("ping"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Fprintf(w, "%d %s", resp.StatusCode, body)
	case "/events":
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		for i := 1; i <= 3; i++ {
			fmt.Fprintf(w, "event: progress\ndata: {\"step\":%d}\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
		}
	case "/export":
		w.Header().Set("Content-Type", "text/csv")
		w.Header().Set("Content-Disposition", `attachment; filename="orders.csv"`)
		out := csv.NewWriter(w)
		out.Write([]string{"id", "customer", "amount", "note"})
		for id := 1; id <= 360000; id++ {
			out.Write([]string{strconv.Itoa(id), "customer-" + strconv.Itoa(id%977), strconv.Itoa(id * 37 % 100000), "a note, with a comma, to quote"})
		}
		out.Flush()
	case "/call-timeout":
		client := &http.Client{Timeout: 200 * time.Millisecond}
		_, err := client.Get(os.Getenv("UPSTREAM") + "/slow")
		var timeout interface{ Timeout() bool }
		ok := err != nil && errorsAs(err, &timeout) && timeout.Timeout()
		fmt.Fprintf(w, "timed out: %v", ok)
	default:
		w.WriteHeader(http.StatusTeapot)
		w.Write([]byte("short and stout"))
	}
}

func errorsAs(err error, target *interface{ Timeout() bool }) bool {
	for err != nil {
		if t, ok := err.(interface{ Timeout() bool }); ok {
			*target = t
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}
