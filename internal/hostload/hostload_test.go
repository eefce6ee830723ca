package hostload

import (
	"strconv"
	"strings"
	"testing"
)

// On Linux the three figures are read and are numbers.
func TestAverageReadsThreeFigures(t *testing.T) {
	f := strings.Fields(Average())
	if len(f) != 3 {
		t.Fatalf("Average() = %q, want three figures", Average())
	}
	for _, s := range f {
		if _, err := strconv.ParseFloat(s, 64); err != nil {
			t.Fatalf("Average() = %q: %q is not a number", Average(), s)
		}
	}
	if !strings.HasPrefix(Label(), "load ") || !strings.HasSuffix(Label(), f[2]) {
		t.Fatalf("Label() = %q", Label())
	}
}
