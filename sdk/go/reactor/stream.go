package reactor

import (
	"fmt"
	"net/http"
	"os"
	"unsafe"
)

// A response streams once the handler flushes it, or once it has written more than
// flushAt bytes: the head leaves through response_start, and the body through
// response_write, as it is written, so that the first byte of a Server-Sent Events
// stream leaves when it is flushed, and a long export never lies whole in memory.
// A response that does neither is sent whole, as wasmless_handle's result.
//
//	response_start(head, head_len) -> errno   the response's encoding without its body
//	response_write(buffer, len) -> errno      the next len bytes of the body
//
// errno 8: the host cannot stream here (the response is then sent whole); errno 14:
// the bytes pass the declared Content-Length (none of them is sent).

//go:wasmimport wasmless response_start
func responseStart(head unsafe.Pointer, headLen uint32) uint32

//go:wasmimport wasmless response_write
func responseWrite(buffer unsafe.Pointer, length uint32) uint32

// flushAt is what the writer holds before the response streams: the most a streamed
// response keeps in the instance, whatever its length.
const flushAt = 64 << 10

const (
	errnoUnavailable   = 8
	errnoContentLength = 14
)

// start sends the response's head; false if the host cannot stream here.
func (w *responseWriter) start() bool {
	if w.unstreamable {
		return false
	}
	head := w.encodeHead(0)
	switch errno := responseStart(unsafe.Pointer(&head[0]), uint32(len(head))); errno {
	case 0:
		w.streaming = true
		return true
	case errnoUnavailable:
		w.unstreamable = true
		return false
	default:
		w.err = fmt.Errorf("wasmless: the response cannot be streamed (errno %d)", errno)
		fmt.Fprintln(os.Stderr, w.err)
		w.unstreamable = true
		return false
	}
}

// drain sends what the writer holds of a streamed body.
func (w *responseWriter) drain() {
	w.send(w.body.Bytes())
	w.body.Reset()
}

// send hands p to the host, which takes it as fast as the client reads.
func (w *responseWriter) send(p []byte) {
	if len(p) == 0 || w.err != nil {
		return
	}
	switch errno := responseWrite(unsafe.Pointer(&p[0]), uint32(len(p))); errno {
	case 0:
	case errnoContentLength:
		w.err = http.ErrContentLength
	default:
		w.err = fmt.Errorf("wasmless: the response body cannot be sent (errno %d)", errno)
	}
}
