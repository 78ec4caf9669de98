// Package outbound lets a handler's net/http client reach other services from inside
// the Wasmless runtime, where a WASI module has no sockets. Requests go to the host
// through the runtime's `wasmless` imports (http_start, http_write_body, http_finish,
// http_read_head, http_read_body, http_close; host/src/outbound_abi/mod.rs); the host
// checks each against the Function's spec.outbound.allow, sends it on its pooled client
// as the handler writes its body, and streams the response body back as the handler
// reads it.
//
// Handlers do not import this package. The builder replaces a file of net/http (go
// build -overlay) so that every *http.Transport — so
// http.Get, http.DefaultClient, &http.Client{Timeout: ...}, and a transport of one's own
// or a clone of http.DefaultTransport — sends its requests here. What differs from
// native Go, as a consequence of the host doing the sending:
//
//   - The host owns connections, TLS and DNS: a Transport's Dial*, TLSClientConfig,
//     Proxy and connection-pool settings are not used (the host pools per Function).
//   - Request and response bodies stream, a 64 KiB piece at a time: a handler can send a
//     body of any size (an io.Reader that makes it as it goes) with its memory not
//     growing; the host takes each piece as the upstream does (backpressure).
//   - A request's context deadline (and so Client.Timeout) bounds the call; a context
//     cancelled without a deadline is seen only between reads of the body.
//   - net.Dial, net.Listen and raw sockets stay unsupported: the builder's overlay of
//     package net makes them fail with an error that says so (sdk/go/outbound/net.go.in).
//
// Errors: a destination the allow-list does not name fails with an error that says so
// and which field to change (errors.Is(err, ErrDenied)); a timeout is a net.Error whose
// Timeout() is true; the others name what failed (DNS, connect, TLS — an untrusted
// certificate names the runtime's --outbound-ca —, a body over
// spec.outbound.maxResponseBody). More calls at once than spec.outbound.maxConcurrency
// wait for a slot; one whose deadline passes while it waits fails with ErrLimit (and
// Timeout() true).
package outbound

import "errors"

// ErrDenied is what a call to a destination outside spec.outbound.allow is (errors.Is).
var ErrDenied = errors.New("wasmless: outbound call denied by spec.outbound.allow")

// ErrLimit is what a call that waited for one of the Function's call slots
// (spec.outbound.maxConcurrency) until its deadline is (errors.Is).
var ErrLimit = errors.New("wasmless: outbound call waited for a slot: spec.outbound.maxConcurrency calls were in flight")

// ErrUnavailable is what a call made while the handler initialises (in a package init,
// run once at build time) is: calls can be made only while serving a request.
var ErrUnavailable = errors.New("wasmless: outbound calls cannot be made while the handler initialises (a package init runs at build time): make them in the handler")
