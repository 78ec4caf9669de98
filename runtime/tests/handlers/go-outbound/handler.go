package handlers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// initError is what a call made while the package initialises (at build time, in the
// snapshot) returned.
var initError = func() string {
	_, err := http.Get("http://127.0.0.1:1/")
	return fmt.Sprint(err)
}()

// Handler calls the URL in ?url= the way handlers written for native Go do, and says
// what came back: "<status> <body>" or "error: <text> timeout=<bool>".
func Handler(w http.ResponseWriter, r *http.Request) {
	target := r.URL.Query().Get("url")
	var resp *http.Response
	var err error
	switch r.URL.Path {
	case "/init":
		fmt.Fprint(w, initError)
		return
	case "/env":
		// Everything the handler can see: its environment and the request's headers.
		fmt.Fprintln(w, strings.Join(os.Environ(), "\n"))
		r.Header.Write(w)
		return
	case "/get":
		resp, err = http.Get(target)
	case "/post":
		body, _ := io.ReadAll(r.Body)
		resp, err = http.Post(target, "text/plain", bytes.NewReader(body))
	case "/client-timeout":
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		client := &http.Client{Timeout: time.Duration(ms) * time.Millisecond}
		resp, err = client.Get(target)
	case "/context-timeout":
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		ctx, cancel := context.WithTimeout(r.Context(), time.Duration(ms)*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
		resp, err = http.DefaultClient.Do(req)
	case "/own-transport":
		transport := http.DefaultTransport.(*http.Transport).Clone()
		resp, err = (&http.Client{Transport: transport}).Get(target)
	}
	if err != nil {
		timeout := false
		var netErr interface{ Timeout() bool }
		if errors.As(err, &netErr) {
			timeout = netErr.Timeout()
		}
		fmt.Fprintf(w, "error: %v timeout=%v deadline=%v", err, timeout, errors.Is(err, context.DeadlineExceeded))
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		fmt.Fprintf(w, "error reading the body: %v", err)
		return
	}
	fmt.Fprintf(w, "%d %s", resp.StatusCode, body)
}
