package handlers

import (
	"fmt"
	"net/http"

	"github.com/google/uuid"
)

// Handler answers with a fresh random UUID and one derived from the request's path, which
// is the same on every call.
func Handler(w http.ResponseWriter, r *http.Request) {
	id := uuid.New()
	named := uuid.NewSHA1(uuid.NameSpaceURL, []byte(r.URL.Path))
	fmt.Fprintf(w, "random %s version %d\nnamed %s\n", id, id.Version(), named)
}
