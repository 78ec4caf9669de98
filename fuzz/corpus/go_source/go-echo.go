package handlers

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"
)

// Handler echoes the request as JSON, and misbehaves on request.
func Handler(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/panic":
		panic("deliberate panic for the test")
	case "/sleep":
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		w.Write([]byte("slept\n"))
		return
	case "/grow":
		var hoard [][]byte
		for {
			hoard = append(hoard, make([]byte, 1<<20))
			hoard[len(hoard)-1][0] = 1
		}
	}
	body, _ := io.ReadAll(r.Body)
	headers := map[string]string{}
	for name := range r.Header {
		headers[name] = r.Header.Get(name)
	}
	query := map[string]string{}
	for key := range r.URL.Query() {
		query[key] = r.URL.Query().Get(key)
	}
	status := http.StatusOK
	if s, err := strconv.Atoi(r.URL.Query().Get("status")); err == nil {
		status = s
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Echo", "go")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{
		"method":     r.Method,
		"path":       r.URL.Path,
		"query":      query,
		"headers":    headers,
		"body":       string(body),
		"env":        os.Getenv("GREETING"),
		"remoteAddr": r.RemoteAddr,
	})
}
