package handlers

import (
	"net/http"

	"github.com/go-chi/chi/v5"
)

var router = func() http.Handler {
	r := chi.NewRouter()
	r.Get("/users/{id}", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("user " + chi.URLParam(r, "id") + "\n"))
	})
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no route for "+r.URL.Path, http.StatusNotFound)
	})
	return r
}()

// Handler routes with chi, as a third-party router does under native Go.
func Handler(w http.ResponseWriter, r *http.Request) { router.ServeHTTP(w, r) }
