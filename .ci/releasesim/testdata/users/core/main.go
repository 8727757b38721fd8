// Command core imports package fairlock alone, as most users do: its
// build must link neither net/http nor OpenTelemetry, and its module
// graph must hold no tools, no OpenTelemetry SDK and no etcd.
package main

import (
	"context"
	"fmt"

	"github.com/fairlock/fairlock/fairlock"
)

func main() {
	l := fairlock.New[string]()
	g, err := l.Lock(context.Background(), "k")
	if err != nil {
		panic(err)
	}
	g.Unlock()
	if err := l.Close(context.Background()); err != nil {
		panic(err)
	}
	fmt.Println("core: locked and unlocked k")
}
