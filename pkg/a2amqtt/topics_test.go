package a2amqtt

import (
	"regexp"
	"testing"
)

// idPattern is the profile's identifier rule, as the specification writes it.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// TestValidIDMatchesPattern: ValidID decides every byte string as the
// pattern does (fuzzed by FuzzValidID; these seeds cover each class edge).
func TestValidIDMatchesPattern(t *testing.T) {
	for _, s := range validIDSeeds {
		if got, want := ValidID(s), idPattern.MatchString(s); got != want {
			t.Errorf("ValidID(%q) = %v, the pattern says %v", s, got, want)
		}
	}
}

var validIDSeeds = []string{"", "a", "Z", "0", "9", "_", ".", "-", "acme", "acme.v2_x-1", "a/b", "a b", "a\n", "\na",
	"é", "a\x00", "@", "[", "`", "{", "/", ":", "+", "#", "$a2a", "a\xff", "..", "-"}

func FuzzValidID(f *testing.F) {
	for _, s := range validIDSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidID(s), idPattern.MatchString(s); got != want {
			t.Errorf("ValidID(%q) = %v, the pattern says %v", s, got, want)
		}
	})
}
