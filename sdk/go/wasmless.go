// Package wasmless runs a Goless handler — func Handler(w http.ResponseWriter, r *http.Request)
// in package handlers — unchanged inside the Wasmless runtime.
//
// A handler built with GOOS=wasip1 GOARCH=wasm is a WASI command started once per
// request. The runtime hands it the request as CGI (RFC 3875): meta-variables in the
// environment, the body on stdin. Serve reads that request with net/http/cgi, calls
// the handler, and writes the response back on stdout. The handler sees an ordinary
// *http.Request (method, URL with query, headers, body, RemoteAddr) and writes to an
// ordinary http.ResponseWriter; the Function's env is the process environment.
//
//	package main
//
//	import (
//		"function/handlers"
//		"wasmless.io/wasmless"
//	)
//
//	func main() { wasmless.ServeFunc(handlers.Handler) }
package wasmless

import (
	"fmt"
	"net/http"
	"net/http/cgi"
	"os"
	"runtime/debug"

	// Outbound calls: with the builder's net/http overlay, every *http.Transport sends
	// through the host (see package outbound).
	_ "wasmless.io/wasmless/outbound"
)

// Serve answers the request this process was started for with handler.
func Serve(handler http.Handler) {
	if err := cgi.Serve(recoverPanics{handler}); err != nil {
		fmt.Fprintf(os.Stderr, "wasmless: cannot serve the request: %v\n", err)
		os.Exit(1)
	}
}

// ServeFunc is Serve for a Goless-style handler function.
func ServeFunc(handler func(http.ResponseWriter, *http.Request)) {
	Serve(http.HandlerFunc(handler))
}

// Recovering wraps handler as Serve does: a panic becomes a 500 while the status can
// still be chosen, and a failed exit (status 2, which the runtime answers with a 500)
// once it cannot. The reactor in package wasmless.io/wasmless/reactor uses it too, so
// that a panic looks the same to a client whichever way a handler is run.
func Recovering(handler http.Handler) http.Handler {
	return recoverPanics{handler}
}

// recoverPanics turns a panic into a 500 while the status can still be chosen, and
// into a failed exit (which the runtime also answers with a 500) once it cannot.
type recoverPanics struct{ next http.Handler }

func (h recoverPanics) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tracked := &trackingWriter{ResponseWriter: w}
	defer func() {
		recovered := recover()
		if recovered == nil {
			return
		}
		fmt.Fprintf(os.Stderr, "handler panicked: %v\n%s", recovered, debug.Stack())
		if tracked.wrote {
			os.Exit(2)
		}
		http.Error(w, "the handler panicked", http.StatusInternalServerError)
	}()
	h.next.ServeHTTP(tracked, r)
}

type trackingWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *trackingWriter) WriteHeader(status int) {
	w.wrote = true
	w.ResponseWriter.WriteHeader(status)
}

func (w *trackingWriter) Write(p []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(p)
}

// Flush passes the handler's flush on: a reactor then sends the head and what was
// written so far (a CGI command's response is sent whole when it exits). The head is
// out, so a panic after it can no longer choose a status.
func (w *trackingWriter) Flush() {
	w.FlushError()
}

// FlushError is Flush for http.ResponseController.
func (w *trackingWriter) FlushError() error {
	w.wrote = true
	switch flusher := w.ResponseWriter.(type) {
	case interface{ FlushError() error }:
		return flusher.FlushError()
	case http.Flusher:
		flusher.Flush()
	}
	return nil
}
