package main

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunExportsEveryInstrument(t *testing.T) {
	var out strings.Builder
	if err := run(&out, 20); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"Name": "fairlock.lock.acquisitions"`, `"Name": "fairlock.lock.wait.duration"`,
		`"Name": "fairlock.lock.hold.duration"`, `"Name": "fairlock.lock.held"`,
		`"Name": "fairlock.lock.waiters"`, `"Value": "accounts"`, `"Value": "acquired"`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("export lacks %s", want)
		}
	}
}
