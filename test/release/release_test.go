// Package release checks the release bundle `make release` writes to dist/ (hack/release.sh):
// its checksums verify, the chart is the VERSION's, the six images are the manifests' and carry
// the VERSION and commit, a2actl is built for each platform with the version stamped, and the
// SBOM lists every module go.mod requires at its version. It reads the bundle make release wrote
// (A2A_FLEET_DIST names another folder) and fails, never skips, when there is none.
package release

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	cdx "github.com/CycloneDX/cyclonedx-go"
	"golang.org/x/mod/modfile"
	"sigs.k8s.io/yaml"
)

const module = "github.com/a2a-fleet/a2a-fleet"

// bundle is dist/ and what the repository says it must hold.
type bundle struct {
	root, dir, version, commit string
}

func open(t *testing.T) bundle {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	b := bundle{root: root, dir: filepath.Join(root, "dist"), version: strings.TrimSpace(string(raw))}
	if d := os.Getenv("A2A_FLEET_DIST"); d != "" {
		b.dir = d
	}
	if _, err := os.Stat(filepath.Join(b.dir, "SHA256SUMS")); err != nil {
		t.Fatalf("no release bundle in %s (%v): run `make release` first (make test does)", b.dir, err)
	}
	out, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v", err)
	}
	b.commit = strings.TrimSpace(string(out))
	return b
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// What a bundle holds besides SHA256SUMS, relative to dist/.
func (b bundle) expectedFiles() []string {
	files := []string{
		"a2a-fleet-" + b.version + ".tgz",
		"a2a-fleet-" + b.version + ".cdx.json",
	}
	for _, p := range platforms {
		files = append(files, "a2actl-"+b.version+"-"+p)
	}
	for name := range images {
		files = append(files, "images/"+name+".tar.gz")
	}
	sort.Strings(files)
	return files
}

var platforms = []string{"linux-amd64", "linux-arm64", "darwin-amd64", "darwin-arm64"}

// images: archive name -> the image it holds, as the manifests name it.
var images = map[string]string{
	"operator":             "a2a-fleet/operator:dev",
	"conversation-service": "a2a-fleet/conversation-service:dev",
	"example-agents":       "a2a-fleet/example-agents:dev",
	"mosquitto":            "a2a-fleet/mosquitto:dev",
	"decision-service":     "a2a-fleet/decision-service:dev",
	"gateway":              "a2a-fleet/gateway:dev",
}

// SHA256SUMS lists every file of the bundle, no other, and each checksum verifies.
func TestChecksumsVerify(t *testing.T) {
	b := open(t)
	f, err := os.Open(filepath.Join(b.dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var listed []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS: malformed line %q", sc.Text())
		}
		listed = append(listed, name)
		got, err := sha256File(filepath.Join(b.dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if got != sum {
			t.Errorf("%s: sha256 %s, SHA256SUMS says %s", name, got, sum)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	var present []string
	err = filepath.WalkDir(b.dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == "SHA256SUMS" {
			return err
		}
		rel, err := filepath.Rel(b.dir, path)
		present = append(present, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(listed)
	sort.Strings(present)
	if !slices.Equal(listed, present) {
		t.Errorf("SHA256SUMS lists %v, the bundle holds %v", listed, present)
	}
	if want := b.expectedFiles(); !slices.Equal(present, want) {
		t.Errorf("the bundle holds %v, want %v", present, want)
	}
	t.Logf("%d files verified against SHA256SUMS", len(listed))
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// The packaged chart's version and appVersion are VERSION, and it holds the templates.
func TestChartIsTheVersion(t *testing.T) {
	b := open(t)
	files := map[string][]byte{}
	err := eachTarEntry(filepath.Join(b.dir, "a2a-fleet-"+b.version+".tgz"), func(name string, r io.Reader) (bool, error) {
		if name == "a2a-fleet/Chart.yaml" || name == "a2a-fleet/values.yaml" || strings.HasPrefix(name, "a2a-fleet/templates/") {
			raw, err := io.ReadAll(r)
			files[name] = raw
			return false, err
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var chart struct{ Name, Version, AppVersion string }
	if err := yaml.Unmarshal(files["a2a-fleet/Chart.yaml"], &chart); err != nil {
		t.Fatalf("Chart.yaml: %v", err)
	}
	if chart.Name != "a2a-fleet" || chart.Version != b.version || chart.AppVersion != b.version {
		t.Errorf("packaged chart %s version %s appVersion %s, want a2a-fleet %s %s", chart.Name, chart.Version, chart.AppVersion, b.version, b.version)
	}
	for _, want := range []string{"a2a-fleet/values.yaml", "a2a-fleet/templates/manager/manager.yaml", "a2a-fleet/templates/mosquitto/deployment.yaml"} {
		if files[want] == nil {
			t.Errorf("the packaged chart has no %s", want)
		}
	}
}

// eachTarEntry calls f with every regular file of a gzipped tar until f says it is done.
func eachTarEntry(path string, f func(name string, r io.Reader) (done bool, err error)) error {
	file, err := os.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	gz, err := gzip.NewReader(file)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		done, err := f(h.Name, tr)
		if err != nil || done {
			return err
		}
	}
}

// a2actl is built for linux and darwin on amd64 and arm64 from this module, with the commit
// stamped; the one for this machine runs and reports VERSION and the commit.
func TestA2actlForEveryPlatform(t *testing.T) {
	b := open(t)
	for _, p := range platforms {
		path := filepath.Join(b.dir, "a2actl-"+b.version+"-"+p)
		info, err := buildinfo.ReadFile(path)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		settings := map[string]string{}
		for _, s := range info.Settings {
			settings[s.Key] = s.Value
		}
		goos, goarch, _ := strings.Cut(p, "-")
		if settings["GOOS"] != goos || settings["GOARCH"] != goarch || info.Path != module+"/cmd/a2actl" {
			t.Errorf("%s: built as %s for %s/%s", p, info.Path, settings["GOOS"], settings["GOARCH"])
		}
		// -trimpath leaves -ldflags out of the build settings: look for the stamped commit in
		// the binary itself (the version is checked by running the native one below).
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(raw, []byte(b.commit)) {
			t.Errorf("%s: commit %s not stamped into the binary", p, b.commit)
		}
	}
	native := filepath.Join(b.dir, "a2actl-"+b.version+"-"+runtime.GOOS+"-"+runtime.GOARCH)
	out, err := exec.Command(native, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s version: %v\n%s", native, err, out)
	}
	if want := fmt.Sprintf("a2actl %s (commit %s,", b.version, b.commit); !strings.HasPrefix(string(out), want) {
		t.Errorf("a2actl version says %q, want %q...", out, want)
	}
}

// The SBOM is CycloneDX JSON whose main component is the module at VERSION and this commit, and
// it lists every module go.mod requires (replacements applied) at go.mod's version, with its
// package URL.
func TestSBOMListsEveryModule(t *testing.T) {
	b := open(t)
	f, err := os.Open(filepath.Join(b.dir, "a2a-fleet-"+b.version+".cdx.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bom := cdx.NewBOM()
	if err := cdx.NewBOMDecoder(f, cdx.BOMFileFormatJSON).Decode(bom); err != nil {
		t.Fatalf("decode the SBOM: %v", err)
	}
	if bom.BOMFormat != "CycloneDX" || bom.Metadata == nil || bom.Metadata.Component == nil || bom.Components == nil {
		t.Fatalf("not a CycloneDX SBOM with a main component and components: %+v", bom)
	}
	main := bom.Metadata.Component
	if main.Name != module || main.Version != b.version {
		t.Errorf("main component %s %s, want %s %s", main.Name, main.Version, module, b.version)
	}
	if main.Properties == nil || !slices.Contains(*main.Properties, cdx.Property{Name: "vcs:commit", Value: b.commit}) {
		t.Errorf("main component does not name commit %s: %+v", b.commit, main.Properties)
	}
	listed := map[string]cdx.Component{}
	for _, c := range *bom.Components {
		listed[c.Name+"@"+c.Version] = c
	}
	raw, err := os.ReadFile(filepath.Join(b.root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := modfile.Parse("go.mod", raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	replaced := map[string]string{}
	for _, r := range mod.Replace {
		replaced[r.Old.Path] = r.New.Path + "@" + r.New.Version
	}
	for _, r := range mod.Require {
		key := r.Mod.Path + "@" + r.Mod.Version
		if to, ok := replaced[r.Mod.Path]; ok {
			key = to
		}
		c, ok := listed[key]
		if !ok {
			t.Errorf("the SBOM does not list %s (go.mod requires it)", key)
			continue
		}
		if want := "pkg:golang/" + key; c.PackageURL != want {
			t.Errorf("%s: purl %q, want %q", key, c.PackageURL, want)
		}
	}
	if bom.Dependencies == nil || !slices.ContainsFunc(*bom.Dependencies, func(d cdx.Dependency) bool {
		return d.Ref == main.BOMRef && d.Dependencies != nil && len(*d.Dependencies) > 0
	}) {
		t.Errorf("the SBOM has no dependencies of the main component")
	}
	t.Logf("SBOM: %d components, every one of go.mod's %d requirements among them", len(listed), len(mod.Require))
}

// Each image archive is a `docker save` of the image the manifests name, labelled with VERSION
// and the commit (RELEASE_ALLOW_IMAGE_REVISION=1, as for hack/release.sh: another commit's
// images of the same VERSION).
func TestImagesAreTheManifests(t *testing.T) {
	b := open(t)
	for name, image := range images {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(b.dir, "images", name+".tar.gz")
			var manifest []struct {
				Config   string
				RepoTags []string
			}
			configs := map[string][]byte{}
			err := eachTarEntry(path, func(entry string, r io.Reader) (bool, error) {
				switch {
				case entry == "manifest.json":
					raw, err := io.ReadAll(r)
					if err == nil {
						err = json.Unmarshal(raw, &manifest)
					}
					return false, err
				case strings.HasSuffix(entry, ".json") || strings.HasPrefix(entry, "blobs/sha256/"):
					// The image config: <digest>.json (Docker's layout) or a blob (OCI's);
					// keep the small ones, layers are large.
					raw, err := io.ReadAll(io.LimitReader(r, 1<<20))
					configs[entry] = raw
					return false, err
				}
				return false, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(manifest) != 1 || !slices.Contains(manifest[0].RepoTags, image) {
				t.Fatalf("%s: manifest.json %+v, want the one image %s", path, manifest, image)
			}
			var config struct {
				Config struct{ Labels map[string]string }
			}
			if err := json.Unmarshal(configs[manifest[0].Config], &config); err != nil {
				t.Fatalf("%s: image config %s: %v", path, manifest[0].Config, err)
			}
			labels := config.Config.Labels
			if v := labels["org.opencontainers.image.version"]; v != b.version {
				t.Errorf("%s: version label %q, want %s", image, v, b.version)
			}
			if rev := labels["org.opencontainers.image.revision"]; rev != b.commit && os.Getenv("RELEASE_ALLOW_IMAGE_REVISION") != "1" {
				t.Errorf("%s: revision label %q, want %s (the bundle's images are built from its commit)", image, rev, b.commit)
			}
		})
	}
}
