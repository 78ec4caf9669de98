//go:build wasip1

package outbound

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

//go:wasmimport wasmless http_send
func httpSend(request unsafe.Pointer, requestLen uint32, timeoutMs uint32, out unsafe.Pointer) uint32

//go:wasmimport wasmless http_read_head
func httpReadHead(handle uint32, buffer unsafe.Pointer, bufferLen uint32) uint32

//go:wasmimport wasmless http_read_body
func httpReadBody(handle uint32, buffer unsafe.Pointer, bufferLen uint32, n unsafe.Pointer) uint32

//go:wasmimport wasmless http_close
func httpClose(handle uint32) uint32

// The host's errnos (runtime/src/outbound/mod.rs, OutboundError::errno).
const (
	errDenied      = 1
	errTimeout     = 2
	errUnavailable = 8
)

// maxRequestBody is what the host accepts in one call, body and head together.
const maxRequestBody = 16 << 20

// netHTTPRoundTrip is what (*http.Transport).RoundTrip calls in a handler the builder
// built: its net/http overlay (roundtrip.go.in) links to this function by name.
func netHTTPRoundTrip(_ *http.Transport, req *http.Request) (*http.Response, error) {
	return roundTrip(req)
}

// Transport sends requests through the host. The builder's net/http overlay makes every
// *http.Transport use it; a handler built another way can set
// http.DefaultTransport = outbound.Transport{}.
type Transport struct{}

// RoundTrip implements http.RoundTripper.
func (Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	return roundTrip(req)
}

// Error is a failed call: Code is the host's errno, Message what it said.
type Error struct {
	Code    uint32
	Message string
	// deadline: the request's context had a deadline, which a timeout is.
	deadline bool
}

func (e *Error) Error() string { return e.Message }

// Timeout reports whether the call timed out (net.Error).
func (e *Error) Timeout() bool { return e.Code == errTimeout }

// Temporary is false: see net.Error.
func (e *Error) Temporary() bool { return false }

// Is makes errors.Is(err, ErrDenied), (err, ErrUnavailable) and, for a timeout of a
// context deadline, (err, context.DeadlineExceeded) true.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrDenied:
		return e.Code == errDenied
	case ErrUnavailable:
		return e.Code == errUnavailable
	case context.DeadlineExceeded:
		return e.Code == errTimeout && e.deadline
	}
	return false
}

func putString(out []byte, text string) []byte {
	out = binary.LittleEndian.AppendUint32(out, uint32(len(text)))
	return append(out, text...)
}

func roundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil {
		closeBody(req)
		return nil, errors.New("wasmless: http: nil Request.URL")
	}
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		closeBody(req)
		return nil, err
	}
	var body []byte
	if req.Body != nil && req.Body != http.NoBody {
		read, err := io.ReadAll(io.LimitReader(req.Body, maxRequestBody+1))
		closeBody(req)
		if err != nil {
			return nil, err
		}
		if len(read) > maxRequestBody {
			return nil, errors.New("wasmless: the request body is over the 16 MiB an outbound call may send")
		}
		body = read
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	encoded := make([]byte, 0, 256+len(body))
	encoded = putString(encoded, method)
	encoded = putString(encoded, req.URL.String())
	headers := req.Header.Clone()
	if headers == nil {
		headers = http.Header{}
	}
	if _, set := headers["User-Agent"]; !set {
		headers.Set("User-Agent", "Go-http-client/1.1")
	}
	if req.Close {
		headers.Set("Connection", "close")
	}
	count := 0
	for _, values := range headers {
		count += len(values)
	}
	encoded = binary.LittleEndian.AppendUint32(encoded, uint32(count))
	for name, values := range headers {
		for _, value := range values {
			encoded = putString(encoded, name)
			encoded = putString(encoded, value)
		}
	}
	encoded = putString(encoded, string(body))

	var timeoutMs uint32
	deadline, hasDeadline := ctx.Deadline()
	if hasDeadline {
		left := time.Until(deadline)
		if left <= 0 {
			return nil, context.DeadlineExceeded
		}
		timeoutMs = uint32(min(left.Milliseconds()+1, 1<<31))
	}
	var out [2]uint32
	errno := httpSend(unsafe.Pointer(&encoded[0]), uint32(len(encoded)), timeoutMs, unsafe.Pointer(&out))
	handle, headLen := out[0], out[1]
	if errno != 0 {
		return nil, failure(errno, handle, headLen, hasDeadline, req)
	}
	head := make([]byte, headLen)
	if headLen > 0 {
		httpReadHead(handle, unsafe.Pointer(&head[0]), headLen)
	}
	resp, err := parseHead(head, req)
	if err != nil {
		httpClose(handle)
		return nil, err
	}
	if req.Method == http.MethodHead || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified {
		httpClose(handle)
		resp.Body = http.NoBody
		resp.ContentLength = 0
		if req.Method == http.MethodHead {
			resp.ContentLength = contentLength(resp.Header)
		}
	} else {
		resp.Body = &responseBody{handle: handle, ctx: ctx, deadline: hasDeadline}
	}
	return resp, nil
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// failure reads the host's message for a failed call (and frees its handle).
func failure(errno, handle, length uint32, deadline bool, req *http.Request) error {
	message := ""
	if handle != 0 {
		if length > 0 {
			buffer := make([]byte, length)
			httpReadHead(handle, unsafe.Pointer(&buffer[0]), length)
			message = string(buffer)
		}
		httpClose(handle)
	}
	if message == "" {
		switch errno {
		case errUnavailable:
			return ErrUnavailable
		case errDenied:
			message = "wasmless: the call to " + req.URL.Host + " was denied: add it to spec.outbound.allow"
		default:
			message = "wasmless: the call to " + req.URL.Host + " failed (errno " + strconv.Itoa(int(errno)) + ")"
		}
	}
	return &Error{Code: errno, Message: message, deadline: deadline}
}

func contentLength(header http.Header) int64 {
	if length, err := strconv.ParseInt(header.Get("Content-Length"), 10, 64); err == nil && length >= 0 {
		return length
	}
	return -1
}

// parseHead reads u32 status, u32 n, n × (str name, str value).
func parseHead(head []byte, req *http.Request) (*http.Response, error) {
	bad := errors.New("wasmless: the host's response head is malformed")
	take := func() (uint32, bool) {
		if len(head) < 4 {
			return 0, false
		}
		value := binary.LittleEndian.Uint32(head)
		head = head[4:]
		return value, true
	}
	text := func() (string, bool) {
		length, ok := take()
		if !ok || uint32(len(head)) < length {
			return "", false
		}
		value := string(head[:length])
		head = head[length:]
		return value, true
	}
	status, ok := take()
	if !ok {
		return nil, bad
	}
	count, ok := take()
	if !ok {
		return nil, bad
	}
	header := make(http.Header, count)
	for i := uint32(0); i < count; i++ {
		name, ok1 := text()
		value, ok2 := text()
		if !ok1 || !ok2 {
			return nil, bad
		}
		header.Add(name, value)
	}
	resp := &http.Response{
		Status:        strconv.Itoa(int(status)) + " " + http.StatusText(int(status)),
		StatusCode:    int(status),
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        header,
		ContentLength: contentLength(header),
		Request:       req,
	}
	if encodings := header.Values("Transfer-Encoding"); len(encodings) > 0 {
		resp.TransferEncoding = strings.Split(strings.Join(encodings, ","), ",")
		header.Del("Transfer-Encoding")
	}
	return resp, nil
}

// responseBody reads the body from the host as the handler asks for it.
type responseBody struct {
	handle   uint32
	ctx      context.Context
	deadline bool
	done     bool
	err      error
}

func (b *responseBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.done {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	if err := b.ctx.Err(); err != nil {
		b.Close()
		b.err = err
		return 0, err
	}
	var n uint32
	errno := httpReadBody(b.handle, unsafe.Pointer(&p[0]), uint32(len(p)), unsafe.Pointer(&n))
	if errno != 0 {
		b.err = &Error{Code: errno, Message: string(p[:n]), deadline: b.deadline}
		clear(p[:n])
		b.Close()
		return 0, b.err
	}
	if n == 0 {
		b.Close()
		b.done = true
		return 0, io.EOF
	}
	return int(n), nil
}

func (b *responseBody) Close() error {
	if b.handle != 0 {
		httpClose(b.handle)
		b.handle = 0
	}
	if !b.done && b.err == nil {
		b.err = errors.New("http: read on closed response body")
	}
	return nil
}
