// A Goless handler that reads a file it ships beside itself, per request.
package handlers

import (
	"net/http"
	"os"
)

func Handler(w http.ResponseWriter, r *http.Request) {
	data, err := os.ReadFile("data/today.txt")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Write(data)
}
