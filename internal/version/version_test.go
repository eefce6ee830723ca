package version

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// repoRoot is two folders up from this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// TestBinariesReportTheRepositoryVersion runs the binaries `make tools-test` builds into bin/
// with the Makefile's ldflags (make test does, before the tests) and requires each to print the
// VERSION file's version and the commit checked out (`git rev-parse HEAD`; "unknown" in a copy
// without .git): a binary built without the stamp says "unknown" and fails here.
func TestBinariesReportTheRepositoryVersion(t *testing.T) {
	root := repoRoot(t)
	want, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	wantVersion := strings.TrimSpace(string(want))
	wantCommit := Unknown
	if head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output(); err == nil {
		wantCommit = strings.TrimSpace(string(head))
	}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"a2actl", []string{"version"}},
		{"devstack", []string{"--version"}},
		{"conversation-service", []string{"--version"}},
		{"manager", []string{"--version"}},
	} {
		bin := filepath.Join(root, "bin", c.name)
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("bin/%s is missing: run `make tools-test` (make test does) before this test: %v", c.name, err)
		}
		out, err := exec.Command(bin, c.args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", c.name, c.args, err, out)
		}
		line := strings.TrimSpace(string(out))
		fields := strings.Fields(line) // NAME VERSION (commit COMMIT, GOVERSION)
		if len(fields) != 5 || fields[0] != c.name || fields[2] != "(commit" {
			t.Fatalf("%s %v printed %q, want %q", c.name, c.args, line, c.name+" VERSION (commit COMMIT, GOVERSION)")
		}
		if fields[1] != wantVersion {
			t.Errorf("%s reports version %q, VERSION says %q", c.name, fields[1], wantVersion)
		}
		if commit := strings.TrimSuffix(fields[3], ","); commit != wantCommit {
			t.Errorf("%s reports commit %q, the checkout is at %q (make relinks bin/ when HEAD moves: run `make tools-test`)", c.name, commit, wantCommit)
		}
		t.Logf("%s", line)
	}
}

func TestCollectorExportsTheBuild(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector())
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(families) != 1 || families[0].GetName() != BuildInfoMetric || len(families[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v, want one %s series", families, BuildInfoMetric)
	}
	m := families[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	i := Get()
	want := map[string]string{"version": i.Version, "commit": i.Commit, "goversion": i.GoVersion}
	if len(labels) != len(want) || m.GetGauge().GetValue() != 1 {
		t.Fatalf("series %v = %v, want labels %v and value 1", labels, m.GetGauge().GetValue(), want)
	}
	for k, v := range want {
		if labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, labels[k], v)
		}
	}
}

func TestUnstampedBuildSaysUnknownVersion(t *testing.T) {
	// A test binary is linked without the Makefile's ldflags and without VCS stamping.
	i := Get()
	if i.Version != Unknown {
		t.Errorf("version %q without ldflags, want %q", i.Version, Unknown)
	}
	if i.Commit == "" {
		t.Error("empty commit: want the VCS revision or unknown")
	}
	if got := i.String("x"); !strings.HasPrefix(got, "x "+Unknown+" (commit ") {
		t.Errorf("String = %q", got)
	}
}
