// Copyright 2026 The Wasmless Authors.
/* A block comment
   that spans lines */ /* and another */
package handlers; import "net/http"

var Handler = func(w http.ResponseWriter, r *http.Request) {}
