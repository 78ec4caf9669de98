package reactor

import _ "unsafe" // for go:linkname

// runtimeReseed seeds Go's runtime random generator (math/rand, math/rand/v2, the seeds
// of maps made from now on) afresh from WASI random_get. Go seeds it once, at start-up,
// which for a snapshot is at build time: without this every request would draw the
// same "random" numbers. Go has no public way to do it, so the builder adds the
// function to package runtime with `go build -overlay` (reseed_runtime.go.in beside
// this file); a Go whose runtime internals changed fails that build, not a request.
//
//go:linkname runtimeReseed runtime.wasmlessReseed
func runtimeReseed()
