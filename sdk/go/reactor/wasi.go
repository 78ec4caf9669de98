package reactor

import (
	"bytes"
	"os"
	"strings"
	"unsafe"
)

// Go reads the environment and the arguments once, when its runtime starts, which for
// a snapshot is at build time. They are read again from WASI at an instance's first
// request, so a handler sees the Function's env as deployed (it changes without a
// rebuild, never within a process).

//go:wasmimport wasi_snapshot_preview1 environ_sizes_get
func environSizesGet(count, size unsafe.Pointer) uint32

//go:wasmimport wasi_snapshot_preview1 environ_get
func environGet(pointers, buffer unsafe.Pointer) uint32

//go:wasmimport wasi_snapshot_preview1 args_sizes_get
func argsSizesGet(count, size unsafe.Pointer) uint32

//go:wasmimport wasi_snapshot_preview1 args_get
func argsGet(pointers, buffer unsafe.Pointer) uint32

// readStrings reads WASI's NUL-terminated list of strings with its sizes and get calls.
func readStrings(sizes, get func(unsafe.Pointer, unsafe.Pointer) uint32) []string {
	var count, size uint32
	if sizes(unsafe.Pointer(&count), unsafe.Pointer(&size)) != 0 || count == 0 {
		return nil
	}
	pointers := make([]uint32, count)
	buffer := make([]byte, size)
	if get(unsafe.Pointer(&pointers[0]), unsafe.Pointer(&buffer[0])) != 0 {
		return nil
	}
	list := make([]string, 0, count)
	for _, entry := range bytes.Split(bytes.TrimSuffix(buffer, []byte{0}), []byte{0}) {
		list = append(list, string(entry))
	}
	return list
}

func refreshEnvironment() {
	os.Clearenv()
	for _, entry := range readStrings(environSizesGet, environGet) {
		if name, value, ok := strings.Cut(entry, "="); ok && name != "" {
			os.Setenv(name, value)
		}
	}
	if args := readStrings(argsSizesGet, argsGet); args != nil {
		os.Args = args
	}
}
