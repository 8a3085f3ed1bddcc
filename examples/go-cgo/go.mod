module capstan.example/gocgo

go 1.19
