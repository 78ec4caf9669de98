// Package reactor serves a Goless handler from a pre-initialised WebAssembly instance:
// the module is built with -buildmode=c-shared (a WASI reactor: `_initialize`, no
// `main`), Go's runtime and the handler's package initialisers run once at build time,
// and the builder snapshots the initialised memory. The runtime then calls the exports
// below once per request, in a fresh copy of that snapshot by default.
//
// The request and response cross the boundary in one binary encoding (little-endian;
// a "str" is a u32 byte length and the bytes):
//
//	request:  str method, str uri (path and query as sent), str proto ("HTTP/1.1"),
//	          str host (the Host header, or empty), str remote ip, u32 remote port,
//	          u32 n, n × (str name, str value), str body
//	response: u32 status, u32 n, n × (str name, str value), str body
//
// The host calls wasmless_request_buffer(len) for a buffer of len bytes in linear
// memory, writes the request there and calls wasmless_handle(), whose result is the
// response's address (high 32 bits) and length (low 32 bits). A response that streams
// (the handler flushed, or wrote more than 64 KiB) goes instead through the imports
// wasmless.response_start (its head) and wasmless.response_write (its body, as it is
// written); wasmless_handle then returns 0 (see stream.go). The request becomes the
// same *http.Request net/http/cgi makes from the CGI environment (the runtime joins the
// values of a repeated header with ", " and leaves out Content-Length, Host and Proxy,
// as its CGI environment does), and the response is what net/http/cgi would write:
// the status, the headers as they were at the first write, a Content-Type sniffed from
// the first bytes if the handler set none, and the body.
//
// What a snapshot froze is made current at the start of an instance's first request:
// the environment and os.Args (read again from WASI), and the seed of Go's runtime
// random generator (behind math/rand, math/rand/v2, map seeds and the scheduler),
// reseeded from WASI random_get. With a fresh instance per request (the default) that
// is every request. An instance the runtime keeps for later requests (isolation:
// shared) then carries on as one Go process would: its generator moves on from request
// to request, and os.Setenv sticks. crypto/rand already reads random_get on every use;
// time.Now and the monotonic clock are read from WASI on every use.
//
//	package main
//
//	import (
//		"function/handlers"
//		"wasmless.io/wasmless/reactor"
//	)
//
//	func init() { reactor.HandleFunc(handlers.Handler) }
//
//	func main() {}
package reactor

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"unsafe"

	"wasmless.io/wasmless"
)

var (
	handler http.Handler
	// The request buffer the host writes into, and the last response, kept reachable
	// here so the garbage collector (which never moves objects) keeps them in place
	// while the host reads or writes them.
	requestBuffer []byte
	response      []byte
	// thawed is false in the snapshot, so in every instance made from it, until its
	// first request has made current what the snapshot froze.
	thawed bool
)

// Handle makes handler the one that serves every request. Call it from an init
// function: main does not run in a reactor.
func Handle(h http.Handler) {
	handler = wasmless.Recovering(h)
}

// HandleFunc is Handle for a Goless-style handler function.
func HandleFunc(f func(http.ResponseWriter, *http.Request)) {
	Handle(http.HandlerFunc(f))
}

//go:wasmexport wasmless_request_buffer
func requestBufferExport(size uint32) uint32 {
	requestBuffer = make([]byte, size)
	if size == 0 {
		return 0
	}
	return uint32(uintptr(unsafe.Pointer(&requestBuffer[0])))
}

//go:wasmexport wasmless_handle
func handleExport() uint64 {
	if !thawed {
		refreshEnvironment()
		runtimeReseed()
		thawed = true
	}
	out := serve(requestBuffer)
	requestBuffer = nil
	response = out
	if len(response) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&response[0])))<<32 | uint64(len(response))
}

func serve(encoded []byte) []byte {
	r, err := decodeRequest(encoded)
	w := newResponseWriter(r)
	if err != nil {
		fmt.Fprintf(os.Stderr, "wasmless: cannot read the request: %v\n", err)
		w.WriteHeader(http.StatusBadRequest)
		w.Write([]byte("the request could not be read\n"))
		return w.encode()
	}
	if handler == nil {
		fmt.Fprintln(os.Stderr, "wasmless: no handler: call reactor.Handle from an init function")
		w.WriteHeader(http.StatusInternalServerError)
		w.Write([]byte("no handler is registered\n"))
		return w.encode()
	}
	handler.ServeHTTP(w, r)
	w.Write(nil) // as net/http/cgi: a response with no body still gets its header
	return w.finish()
}

type decoder struct {
	data []byte
	err  error
}

func (d *decoder) u32() uint32 {
	if d.err != nil {
		return 0
	}
	if len(d.data) < 4 {
		d.err = errors.New("truncated")
		return 0
	}
	v := binary.LittleEndian.Uint32(d.data)
	d.data = d.data[4:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.u32()
	if d.err != nil {
		return nil
	}
	if uint32(len(d.data)) < n {
		d.err = errors.New("truncated")
		return nil
	}
	v := d.data[:n:n]
	d.data = d.data[n:]
	return v
}

func (d *decoder) str() string { return string(d.bytes()) }

// decodeRequest builds the request net/http/cgi's RequestFromMap builds from the same
// facts, so that a handler sees no difference between the two ABIs.
func decodeRequest(encoded []byte) (*http.Request, error) {
	d := &decoder{data: encoded}
	r := &http.Request{
		Method:  d.str(),
		Close:   true,
		Header:  http.Header{},
		Trailer: http.Header{},
	}
	uri := d.str()
	r.Proto = d.str()
	r.Host = d.str()
	remoteIP := d.str()
	remotePort := d.u32()
	for n := d.u32(); n > 0 && d.err == nil; n-- {
		name, value := d.str(), d.str()
		r.Header.Add(name, value)
	}
	body := d.bytes()
	if d.err != nil {
		return nil, d.err
	}
	var ok bool
	if r.ProtoMajor, r.ProtoMinor, ok = http.ParseHTTPVersion(r.Proto); !ok {
		return nil, fmt.Errorf("invalid protocol version %q", r.Proto)
	}
	if r.Host != "" {
		if u, err := url.Parse("http://" + r.Host + uri); err == nil {
			r.URL = u
		}
	}
	if r.URL == nil {
		u, err := url.Parse(uri)
		if err != nil {
			return nil, fmt.Errorf("cannot parse the request URI %q: %v", uri, err)
		}
		r.URL = u
	}
	r.RemoteAddr = net.JoinHostPort(remoteIP, strconv.Itoa(int(remotePort)))
	r.ContentLength = int64(len(body))
	if len(body) > 0 {
		r.Body = io.NopCloser(bytes.NewReader(body))
	} else {
		r.Body = http.NoBody
	}
	return r, nil
}

// responseWriter collects the response as net/http/cgi's writer would send it, and
// streams it (stream.go) once the handler flushes or writes more than flushAt bytes.
type responseWriter struct {
	header      http.Header
	sent        http.Header // the header as it was at the first write
	code        int
	wroteHeader bool
	body        bytes.Buffer
	headRequest bool
	// declared is the Content-Length the header held at the first write (-1: none), and
	// written what the handler has written of the body.
	declared, written int64
	// streaming: the head has left, the body goes as it comes. unstreamable: the host
	// cannot stream here, so the response is sent whole.
	streaming, unstreamable bool
	err                     error
}

func newResponseWriter(r *http.Request) *responseWriter {
	return &responseWriter{header: http.Header{}, declared: -1, headRequest: r != nil && r.Method == http.MethodHead}
}

func (w *responseWriter) Header() http.Header { return w.header }

func (w *responseWriter) WriteHeader(code int) {
	if w.wroteHeader {
		fmt.Fprintf(os.Stderr, "CGI attempted to write header twice\n")
		return
	}
	w.wroteHeader = true
	w.code = code
}

func (w *responseWriter) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.sent == nil {
		w.takeHeader(p)
	}
	if w.declared >= 0 && w.written+int64(len(p)) > w.declared {
		fmt.Fprintln(os.Stderr, "http: wrote more than the declared Content-Length")
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	if w.body.Len()+len(p) <= flushAt || (!w.streaming && !w.start()) {
		return w.body.Write(p)
	}
	w.drain()
	if len(p) <= flushAt {
		w.body.Write(p)
	} else {
		w.send(p)
	}
	if w.err != nil {
		return 0, w.err
	}
	return len(p), nil
}

// takeHeader keeps the header as it is at the first write, with a Content-Type sniffed
// from the first bytes if the handler set none, and reads its Content-Length (an invalid
// one is dropped, as net/http drops it).
func (w *responseWriter) takeHeader(p []byte) {
	w.sent = w.header.Clone()
	if _, hasType := w.sent["Content-Type"]; !hasType {
		w.sent.Set("Content-Type", http.DetectContentType(p))
	}
	if value := w.sent.Get("Content-Length"); value != "" {
		n, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		if err != nil || n < 0 {
			fmt.Fprintf(os.Stderr, "http: invalid Content-Length of %q\n", value)
			w.sent.Del("Content-Length")
		} else {
			w.declared = n
		}
	}
}

// Flush sends the head now, and what the handler wrote so far; the rest of the body
// follows as it is written.
func (w *responseWriter) Flush() { w.FlushError() }

// FlushError is Flush for http.ResponseController: the error of a stream that failed.
func (w *responseWriter) FlushError() error {
	if w.err != nil {
		return w.err
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.sent == nil {
		w.takeHeader(nil)
	}
	if w.streaming || w.start() {
		w.drain()
	}
	return w.err
}

// finish ends the response when the handler returns: what is left of a stream, or the
// whole response (nil when it streamed).
func (w *responseWriter) finish() []byte {
	// A body shorter than its declared length: streamed, so that the host cuts the
	// connection as net/http does, rather than send a length the body does not have.
	if !w.streaming && w.declared > w.written && !w.headRequest {
		w.start()
	}
	if w.streaming {
		w.drain()
		return nil
	}
	return w.encode()
}

// encodeHead is the response's encoding up to its body.
func (w *responseWriter) encodeHead(extra int) []byte {
	names := make([]string, 0, len(w.sent))
	count := 0
	for name, values := range w.sent {
		names = append(names, name)
		count += len(values)
	}
	sort.Strings(names)
	out := make([]byte, 0, 64+extra)
	out = binary.LittleEndian.AppendUint32(out, uint32(w.code))
	out = binary.LittleEndian.AppendUint32(out, uint32(count))
	// As http.Header.Write, which net/http/cgi uses: newlines in values become spaces
	// and values are trimmed.
	clean := strings.NewReplacer("\n", " ", "\r", " ")
	for _, name := range names {
		for _, value := range w.sent[name] {
			out = appendString(out, name)
			out = appendString(out, strings.TrimSpace(clean.Replace(value)))
		}
	}
	return out
}

func (w *responseWriter) encode() []byte {
	out := w.encodeHead(4 + w.body.Len())
	out = binary.LittleEndian.AppendUint32(out, uint32(w.body.Len()))
	return append(out, w.body.Bytes()...)
}

func appendString(out []byte, s string) []byte {
	out = binary.LittleEndian.AppendUint32(out, uint32(len(s)))
	return append(out, s...)
}
