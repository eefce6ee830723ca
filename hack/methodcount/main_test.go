package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestCountsPromotedMethods(t *testing.T) {
	var out bytes.Buffer
	over, err := run([]string{"./testdata/fat"}, 20, true, &out)
	if err != nil {
		t.Fatal(err)
	}
	if over != 1 {
		t.Fatalf("%d types over 20, want 1 (Big):\n%s", over, out.String())
	}
	for _, want := range []string{"fat.Big: 22 methods (more than 20)", "fat.Small: 0 methods", "fat.Wide: 3 methods", "fat.a: 11 methods", "fat.b: 11 methods"} {
		if !strings.Contains(out.String(), want+"\n") {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
