module example.com/chifn

go 1.21

require github.com/go-chi/chi/v5 v5.2.1
