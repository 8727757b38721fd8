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
