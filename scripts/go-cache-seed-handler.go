// The sample handler of the builder image's Go cache seed (scripts/build-images.sh,
// Dockerfile.builder): it imports what handlers import most, beyond what the SDK does.
package handlers

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

func Handler(w http.ResponseWriter, r *http.Request) {
	q, _ := url.ParseQuery(r.URL.RawQuery)
	keys := make([]string, 0, len(q))
	for key := range q {
		keys = append(keys, strings.ToLower(key))
	}
	sort.Strings(keys)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"keys": keys, "at": time.Now().Format(time.RFC3339), "n": strconv.Itoa(len(keys)), "host": os.Getenv("HOSTNAME")})
	fmt.Fprintln(w)
}
