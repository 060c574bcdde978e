package main

import (
	"os"
	"strings"
	"testing"
)

// TestConfigurationReference fails when docs/configuration.md is not what
// the flags say: run `make docs` after changing a flag.
func TestConfigurationReference(t *testing.T) {
	var b strings.Builder
	if err := writeReference(&b, newRootCommand()); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatalf("%v: run make docs", err)
	}
	if string(got) != b.String() {
		t.Fatal("docs/configuration.md is not the reference of the current flags: run `make docs` and commit it")
	}
	for _, want := range []string{"## fleetgraph serve", "`--tokens-file`", "## fleetgraph edge", "`--manager`", "## fleetgraph demo", "`--log-level`"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the reference has no %q", want)
		}
	}
}
