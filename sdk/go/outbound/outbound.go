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

//go:wasmimport wasmless http_start
func httpStart(head unsafe.Pointer, headLen uint32, timeoutMs uint32, out unsafe.Pointer) uint32

//go:wasmimport wasmless http_write_body
func httpWriteBody(handle uint32, buffer unsafe.Pointer, bufferLen uint32) uint32

//go:wasmimport wasmless http_finish
func httpFinish(handle uint32, out unsafe.Pointer) uint32

//go:wasmimport wasmless http_read_head
func httpReadHead(handle uint32, buffer unsafe.Pointer, bufferLen uint32) uint32

//go:wasmimport wasmless http_read_body
func httpReadBody(handle uint32, buffer unsafe.Pointer, bufferLen uint32, n unsafe.Pointer) uint32

//go:wasmimport wasmless http_close
func httpClose(handle uint32) uint32

// The host's errnos (outbound/src/error.rs, OutboundError::errno, and
// wasmless_formats::outbound).
const (
	errDenied      = 1
	errTimeout     = 2
	errLimit       = 7
	errUnavailable = 8
	errCallEnded   = 12
)

// flagBody in a request head: a body follows, through http_write_body.
const flagBody = 1

// bodyPiece is how much of a request body crosses to the host at once: the memory a call
// with a body needs in the guest, whatever the body's size.
const bodyPiece = 64 << 10

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

// Timeout reports whether the call timed out (net.Error): its deadline passed, in the
// call or while it waited for one of the Function's call slots (errors.Is ErrLimit).
func (e *Error) Timeout() bool { return e.Code == errTimeout || e.Code == errLimit }

// Temporary is false: see net.Error.
func (e *Error) Temporary() bool { return false }

// Is makes errors.Is(err, ErrDenied), (err, ErrLimit), (err, ErrUnavailable) and, for a
// timeout of a context deadline, (err, context.DeadlineExceeded) true.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrDenied:
		return e.Code == errDenied
	case ErrLimit:
		return e.Code == errLimit
	case ErrUnavailable:
		return e.Code == errUnavailable
	case context.DeadlineExceeded:
		return e.Timeout() && e.deadline
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
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	hasBody := req.Body != nil && req.Body != http.NoBody
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
	// Content-Length as net/http's transport sends it: a known length, or 0 for a
	// bodiless POST, PUT or PATCH; a body of unknown length goes chunked.
	headers.Del("Content-Length")
	switch {
	case hasBody && req.ContentLength > 0:
		headers.Set("Content-Length", strconv.FormatInt(req.ContentLength, 10))
	case !hasBody && (method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch):
		headers.Set("Content-Length", "0")
	}
	head := make([]byte, 0, 256)
	head = putString(head, method)
	head = putString(head, req.URL.String())
	count := 0
	for _, values := range headers {
		count += len(values)
	}
	head = binary.LittleEndian.AppendUint32(head, uint32(count))
	for name, values := range headers {
		for _, value := range values {
			head = putString(head, name)
			head = putString(head, value)
		}
	}
	var flags uint32
	if hasBody {
		flags = flagBody
	}
	head = binary.LittleEndian.AppendUint32(head, flags)

	var timeoutMs uint32
	deadline, hasDeadline := ctx.Deadline()
	if hasDeadline {
		left := time.Until(deadline)
		if left <= 0 {
			closeBody(req)
			return nil, context.DeadlineExceeded
		}
		timeoutMs = uint32(min(left.Milliseconds()+1, 1<<31))
	}
	var out [2]uint32
	errno := httpStart(unsafe.Pointer(&head[0]), uint32(len(head)), timeoutMs, unsafe.Pointer(&out))
	handle := out[0]
	if errno != 0 {
		closeBody(req)
		return nil, failure(errno, handle, out[1], hasDeadline, req)
	}
	if hasBody {
		err := writeBody(ctx, handle, req.Body)
		closeBody(req)
		if err != nil {
			// Abandoned, not finished: the upstream sees the call fail, never a body cut
			// short as if it were whole.
			httpClose(handle)
			return nil, err
		}
	}
	var headLen uint32
	errno = httpFinish(handle, unsafe.Pointer(&headLen))
	if errno != 0 {
		return nil, failure(errno, handle, headLen, hasDeadline, req)
	}
	response := make([]byte, headLen)
	if headLen > 0 {
		httpReadHead(handle, unsafe.Pointer(&response[0]), headLen)
	}
	resp, err := parseHead(response, req)
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

// writeBody streams body to the host a piece at a time; the host takes each piece when
// the upstream has room for it. It stops early, without error, when the call ended first
// (http_finish then gives the upstream's early answer or the failure); an error is the
// body's own (or the context's), and the call is then abandoned.
func writeBody(ctx context.Context, handle uint32, body io.Reader) error {
	buffer := make([]byte, bodyPiece)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := body.Read(buffer)
		if n > 0 {
			if errno := httpWriteBody(handle, unsafe.Pointer(&buffer[0]), uint32(n)); errno != 0 {
				// errCallEnded, a deadline, or 13 (in a pool, no memory left for the piece: the
				// call is abandoned): either way http_finish tells what happened.
				return nil
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
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
