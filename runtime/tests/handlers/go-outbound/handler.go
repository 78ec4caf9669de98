package handlers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"wasmless.io/wasmless/outbound"
)

// initError is what a call made while the package initialises (at build time, in the
// snapshot) returned.
var initError = func() string {
	_, err := http.Get("http://127.0.0.1:1/")
	return fmt.Sprint(err)
}()

// Handler calls the URL in ?url= the way handlers written for native Go do, and says
// what came back: "<status> <body>" or "error: <text> timeout=<bool> deadline=<bool>
// errno=<host errno>".
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
	case "/upload":
		// A body larger than any buffer, made as it is sent: the handler's memory must
		// not grow with it.
		mib, _ := strconv.Atoi(r.URL.Query().Get("mib"))
		body := &generated{left: int64(mib) << 20, sum: sha256.New()}
		body.failAt, _ = strconv.ParseInt(r.URL.Query().Get("fail-at"), 10, 64)
		req, _ := http.NewRequest(http.MethodPut, target, body)
		if r.URL.Query().Get("length") == "known" {
			req.ContentLength = int64(mib) << 20
		}
		resp, err = http.DefaultClient.Do(req)
		if err == nil {
			defer resp.Body.Close()
			answer, _ := io.ReadAll(resp.Body)
			var stats runtime.MemStats
			runtime.ReadMemStats(&stats)
			fmt.Fprintf(w, "%d %s sent=%x sys=%d", resp.StatusCode, answer, body.sum.Sum(nil), stats.Sys)
			return
		}
	case "/sockets":
		// Everything a handler might reach for instead of net/http.
		addr := r.URL.Query().Get("addr")
		var errs []string
		note := func(what string, err error) { errs = append(errs, fmt.Sprintf("%s: %v", what, err)) }
		_, err := net.Dial("tcp", addr)
		note("Dial", err)
		_, err = net.DialTimeout("tcp", addr, time.Second)
		note("DialTimeout", err)
		_, err = (&net.Dialer{}).DialContext(r.Context(), "tcp", addr)
		note("DialContext", err)
		_, err = net.Listen("tcp", "127.0.0.1:0")
		note("Listen", err)
		_, err = net.ListenPacket("udp", "127.0.0.1:0")
		note("ListenPacket", err)
		_, err = net.DialTCP("tcp", nil, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 80})
		note("DialTCP", err)
		fmt.Fprint(w, strings.Join(errs, "\n"))
		return
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
		// The host's errno, where the error is the SDK's (a Client.Timeout hides it).
		errno := uint32(0)
		var hostErr *outbound.Error
		if errors.As(err, &hostErr) {
			errno = hostErr.Code
		}
		fmt.Fprintf(w, "error: %v timeout=%v deadline=%v errno=%d", err, timeout, errors.Is(err, context.DeadlineExceeded), errno)
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

// generated is a body of left bytes made as they are read, hashed on the way; with
// failAt, its reader fails there.
type generated struct {
	left   int64
	at     int64
	failAt int64
	sum    hash.Hash
}

func (g *generated) Read(p []byte) (int, error) {
	if g.failAt > 0 && g.at >= g.failAt {
		return 0, errors.New("the body's reader failed")
	}
	if g.left == 0 {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), g.left))
	for i := range p[:n] {
		at := g.at + int64(i)
		p[i] = byte(at*31 + at>>11)
	}
	g.at += int64(n)
	g.left -= int64(n)
	g.sum.Write(p[:n])
	return n, nil
}
