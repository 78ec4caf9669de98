package handlers

import (
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"math/rand"
	randv2 "math/rand/v2"
	"net/http"
	"os"
	"time"
)

// State a snapshot freezes, and state one request could leave to the next.
var (
	initialised = time.Now()
	requests    int
	leftover    = "nothing"
)

// Handler reports what it sees of the environment, the clocks, the random generators
// and the state earlier requests left behind.
func Handler(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/loop":
		for {
		}
	case "/grow":
		var hoard [][]byte
		for {
			hoard = append(hoard, make([]byte, 1<<20))
			hoard[len(hoard)-1][0] = 1
		}
	}
	requests++
	if r.URL.Path == "/panic" {
		panic("deliberate panic after counting the request")
	}
	seen := leftover
	start := time.Now()
	time.Sleep(time.Millisecond)
	elapsed := time.Since(start)
	random := make([]byte, 16)
	crand.Read(random)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{
		"requests":   requests,
		"leftover":   seen,
		"env":        os.Getenv("GREETING"),
		"args":       os.Args,
		"now":        time.Now().UnixNano(),
		"sinceInit":  time.Since(initialised).Nanoseconds(),
		"elapsed":    elapsed.Nanoseconds(),
		"mathRand":   rand.Int63(),
		"mathRandV2": randv2.Uint64(),
		"cryptoRand": hex.EncodeToString(random),
	})
	leftover = "written by an earlier request"
	go func() {
		time.Sleep(time.Millisecond)
		leftover = "written by a goroutine of an earlier request"
	}()
}
