module wasmless.io/wasmless

go 1.21
