// Package outbound lets a handler's net/http client reach other services from inside
// the Wasmless runtime, where a WASI module has no sockets. Requests go to the host
// through the runtime's `wasmless` imports (http_send, http_read_head, http_read_body,
// http_close); the host checks each against the Function's spec.outbound.allow, sends
// it on its pooled client and streams the response body back as the handler reads it.
//
// Handlers do not import this package. The builder replaces a file of net/http (go
// build -overlay) so that every *http.Transport — so
// http.Get, http.DefaultClient, &http.Client{Timeout: ...}, and a transport of one's own
// or a clone of http.DefaultTransport — sends its requests here. What differs from
// native Go, as a consequence of the host doing the sending:
//
//   - The host owns connections, TLS and DNS: a Transport's Dial*, TLSClientConfig,
//     Proxy and connection-pool settings are not used (the host pools per Function).
//   - A request body is read whole before the call (at most 16 MiB); the response body
//     streams.
//   - A request's context deadline (and so Client.Timeout) bounds the call; a context
//     cancelled without a deadline is seen only between reads of the body.
//   - net.Dial and raw sockets stay unsupported (no such import).
//
// Errors: a destination the allow-list does not name fails with an error that says so
// and which field to change (errors.Is(err, ErrDenied)); a timeout is a net.Error whose
// Timeout() is true; the others name what failed (DNS, connect, TLS, a body over
// spec.outbound.maxResponseBody, too many calls at once).
package outbound

import "errors"

// ErrDenied is what a call to a destination outside spec.outbound.allow is (errors.Is).
var ErrDenied = errors.New("wasmless: outbound call denied by spec.outbound.allow")

// ErrUnavailable is what a call made while the handler initialises (in a package init,
// run once at build time) is: calls can be made only while serving a request.
var ErrUnavailable = errors.New("wasmless: outbound calls cannot be made while the handler initialises (a package init runs at build time): make them in the handler")
