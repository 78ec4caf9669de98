package handlers

import (
	"encoding/csv"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

var requests int

// Handler streams responses the ways people write them: Server-Sent Events flushed one
// by one, a long CSV export written row by row, a declared Content-Length, a stream
// without end, and failures after the head has left.
func Handler(w http.ResponseWriter, r *http.Request) {
	query := r.URL.Query()
	number := func(name string, otherwise int) int {
		if n, err := strconv.Atoi(query.Get(name)); err == nil {
			return n
		}
		return otherwise
	}
	flusher := w.(http.Flusher)
	switch r.URL.Path {
	case "/sse":
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < number("n", 5); i++ {
			if i > 0 {
				time.Sleep(time.Duration(number("ms", 300)) * time.Millisecond)
			}
			fmt.Fprintf(w, "id: %d\ndata: event %d\n\n", i, i)
			flusher.Flush()
		}
	case "/forever":
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; ; i++ {
			fmt.Fprintf(w, "data: tick %d\n\n", i)
			flusher.Flush()
			time.Sleep(time.Duration(number("ms", 100)) * time.Millisecond)
		}
	case "/csv":
		w.Header().Set("Content-Type", "text/csv")
		out := csv.NewWriter(w)
		for row := 0; row*64 < number("bytes", 1<<20); row++ {
			// 64 bytes a row: a number, padding, a newline.
			out.Write([]string{fmt.Sprintf("%010d", row), strings.Repeat("x", 52)})
		}
		out.Flush()
	case "/length":
		declared, wanted := number("declared", 0), number("write", 0)
		w.Header().Set("Content-Length", strconv.Itoa(declared))
		piece := []byte(strings.Repeat("L", 100<<10))
		for written := 0; written < wanted; {
			n := min(len(piece), wanted-written)
			if _, err := w.Write(piece[:n]); err != nil {
				fmt.Fprintf(os.Stderr, "write at %d: %v\n", written, err)
				return
			}
			written += n
		}
	case "/panic-after":
		fmt.Fprintln(w, "the head and a first line")
		flusher.Flush()
		panic("after the head")
	case "/grow-after":
		fmt.Fprintln(w, "the head and a first line")
		flusher.Flush()
		var hoard [][]byte
		for {
			hoard = append(hoard, make([]byte, 1<<20))
		}
	case "/flush-head":
		w.WriteHeader(http.StatusCreated)
		flusher.Flush()
		time.Sleep(300 * time.Millisecond)
		fmt.Fprintln(w, "after the head")
	case "/sleep":
		time.Sleep(time.Duration(number("ms", 0)) * time.Millisecond)
		fmt.Fprint(w, "slept")
	case "/count":
		requests++
		fmt.Fprintf(w, "%d", requests)
	default:
		fmt.Fprint(w, "ok")
	}
}
