package main

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCycleFound: testdata/cyclic's table.go and shard.go use each other
// (a shard calling its table, the fault this check exists for), through
// a method and a field; top.go uses both and is in no cycle.
func TestCycleFound(t *testing.T) {
	g, err := load("testdata/cyclic", "")
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"shard.go", "table.go"}}
	if diff := cmp.Diff(want, g.cycles()); diff != "" {
		t.Errorf("cycles (-want +got):\n%s", diff)
	}
	if got := g.uses["shard.go"]["table.go"]; !slices.Equal(got, []string{"now", "table"}) {
		t.Errorf("shard.go uses %v of table.go, want [now table]", got)
	}
}

// TestLayeredPassesAndNamesTellApart: in testdata/layered, two files
// declare a method named find on different types; each file's use of its
// own find must not count as a use of the other file, which a check by
// name alone would report as a cycle.
func TestLayeredPassesAndNamesTellApart(t *testing.T) {
	g, err := load("testdata/layered", "")
	if err != nil {
		t.Fatal(err)
	}
	if c := g.cycles(); len(c) != 0 {
		t.Fatalf("cycles %v in a layered package", c)
	}
	if diff := cmp.Diff([]string{"entry.go", "shard.go", "top.go"}, g.order()); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
}
