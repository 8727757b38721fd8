package owner_test

import (
	"context"
	"fmt"

	"github.com/fairlock/fairlock/owner"
)

// A request handler names its flow once; every goroutine that carries ctx
// is then the same owner.
func ExampleNewContext() {
	ctx := owner.NewContext(context.Background())
	id, ok := owner.FromContext(ctx)
	fmt.Println(ok, id.IsFlow(), owner.Of(ctx) == id)
	// Output: true true true
}

// A request handler labels its flow with the request's ID, so that a lock
// it holds or waits for can be tied to the request in errors, debug
// output and warnings.
func ExampleNewLabeledContext() {
	ctx := owner.NewLabeledContext(context.Background(), "req-42")
	id := owner.Of(ctx)
	fmt.Println(id.Label(), id.String() == id.Name()+` "req-42"`)
	// Output: req-42 true
}
