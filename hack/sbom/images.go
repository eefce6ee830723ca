package main

import (
	"archive/tar"
	"bufio"
	"cmp"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/textproto"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	cdx "github.com/CycloneDX/cyclonedx-go"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// debPackage is one installed package of an image's dpkg database.
type debPackage struct {
	Name, Version, Arch, Source string
}

// imageContents is what an image archive tells about its Debian packages.
type imageContents struct {
	Tag      string // the first repository tag of the archive (a2a-fleet/mosquitto:dev)
	Digest   string // the image's config digest (its ID)
	Distro   string // os-release ID-VERSION_ID (debian-12), empty without an os-release
	Packages []debPackage
}

// readImage reads a `docker save` archive (gzip-compressed or not) with go-containerregistry and
// walks its flattened filesystem (the layers applied in order, whiteouts honoured) for the dpkg
// database: /var/lib/dpkg/status (Debian) and the files of /var/lib/dpkg/status.d/ (distroless
// writes one per package there), and /etc/os-release for the distribution.
func readImage(archive string) (*imageContents, error) {
	opener := func() (io.ReadCloser, error) { return openArchive(archive) }
	manifest, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", archive, err)
	}
	if len(manifest) != 1 {
		return nil, fmt.Errorf("%s: %d images, want one", archive, len(manifest))
	}
	img, err := tarball.Image(opener, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", archive, err)
	}
	out := &imageContents{}
	if len(manifest[0].RepoTags) > 0 {
		out.Tag = manifest[0].RepoTags[0]
	}
	var digest v1.Hash
	if digest, err = img.ConfigName(); err != nil {
		return nil, fmt.Errorf("%s: %w", archive, err)
	}
	out.Digest = digest.String()
	fs := mutate.Extract(img)
	defer fs.Close()
	osRelease := map[string]string{}
	tr := tar.NewReader(fs)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: read the image's files: %w", archive, err)
		}
		name := path.Clean("/" + h.Name)
		switch {
		case h.Typeflag != tar.TypeReg:
		case name == "/var/lib/dpkg/status", strings.HasPrefix(name, "/var/lib/dpkg/status.d/") && !strings.HasSuffix(name, ".md5sums"):
			pkgs, err := parseDpkgStatus(tr)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", archive, name, err)
			}
			out.Packages = append(out.Packages, pkgs...)
		case name == "/etc/os-release", name == "/usr/lib/os-release" && len(osRelease) == 0:
			if osRelease, err = parseOSRelease(tr); err != nil {
				return nil, fmt.Errorf("%s: %s: %w", archive, name, err)
			}
		}
	}
	if id, version := osRelease["ID"], osRelease["VERSION_ID"]; id != "" && version != "" {
		out.Distro = id + "-" + version
	}
	sort.Slice(out.Packages, func(i, j int) bool { return out.Packages[i].Name < out.Packages[j].Name })
	return out, nil
}

func openArchive(file string) (io.ReadCloser, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	br := bufio.NewReader(f)
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, err
		}
		return struct {
			io.Reader
			io.Closer
		}{gz, f}, nil
	}
	return struct {
		io.Reader
		io.Closer
	}{br, f}, nil
}

// parseDpkgStatus reads dpkg's status format (paragraphs of RFC 822 fields, deb822) and returns
// the packages whose Status says installed.
func parseDpkgStatus(r io.Reader) ([]debPackage, error) {
	tp := textproto.NewReader(bufio.NewReader(r))
	var out []debPackage
	for {
		h, err := tp.ReadMIMEHeader()
		if len(h) > 0 {
			status := strings.Fields(h.Get("Status"))
			// "install ok installed"; distroless's status.d files carry no Status field.
			if h.Get("Package") != "" && (len(status) == 0 || status[len(status)-1] == "installed") {
				source, _, _ := strings.Cut(h.Get("Source"), " ")
				out = append(out, debPackage{Name: h.Get("Package"), Version: h.Get("Version"), Arch: h.Get("Architecture"), Source: source})
			}
		}
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// parseOSRelease reads os-release's KEY=value lines (values optionally quoted).
func parseOSRelease(r io.Reader) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if ok && !strings.HasPrefix(k, "#") {
			out[k] = strings.Trim(v, `"'`)
		}
	}
	return out, sc.Err()
}

// debPurl is a Debian package's package URL (purl-spec, type deb): namespace debian, the
// architecture and the distribution as qualifiers, the source package when it differs.
func debPurl(p debPackage, distro string) string {
	q := url.Values{}
	if p.Arch != "" {
		q.Set("arch", p.Arch)
	}
	if distro != "" {
		q.Set("distro", distro)
	}
	if p.Source != "" && p.Source != p.Name {
		q.Set("upstream", p.Source)
	}
	s := "pkg:deb/debian/" + url.PathEscape(p.Name) + "@" + url.PathEscape(p.Version)
	if len(q) > 0 {
		s += "?" + q.Encode()
	}
	return s
}

// imageArchives lists the image archives of a folder (make release's dist/images).
func imageArchives(dir string) ([]string, error) {
	var out []string
	for _, pattern := range []string{"*.tar.gz", "*.tar"} {
		m, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			return nil, err
		}
		out = append(out, m...)
	}
	sort.Strings(out)
	if len(out) == 0 {
		return nil, fmt.Errorf("no image archive (*.tar.gz, *.tar) in %s", dir)
	}
	return out, nil
}

// addImages adds each image as a container component that depends on the Debian packages found
// in it, each package once (by purl) however many images hold it.
func addImages(bom *cdx.BOM, dir string) error {
	archives, err := imageArchives(dir)
	if err != nil {
		return err
	}
	components := *bom.Components
	deps := *bom.Dependencies
	seen := map[string]bool{}
	for _, archive := range archives {
		img, err := readImage(archive)
		if err != nil {
			return err
		}
		name, tag, _ := strings.Cut(img.Tag, ":")
		ref := "image:" + cmp.Or(img.Tag, filepath.Base(archive))
		image := cdx.Component{Type: cdx.ComponentTypeContainer, BOMRef: ref, Name: cmp.Or(name, filepath.Base(archive)), Version: tag,
			Hashes:     &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: strings.TrimPrefix(img.Digest, "sha256:")}},
			Properties: &[]cdx.Property{{Name: "a2a-fleet:archive", Value: "images/" + filepath.Base(archive)}}}
		if img.Distro != "" {
			*image.Properties = append(*image.Properties, cdx.Property{Name: "a2a-fleet:distro", Value: img.Distro})
		}
		components = append(components, image)
		on := []string{}
		for _, p := range img.Packages {
			purl := debPurl(p, img.Distro)
			on = append(on, purl)
			if seen[purl] {
				continue
			}
			seen[purl] = true
			components = append(components, cdx.Component{Type: cdx.ComponentTypeLibrary, BOMRef: purl, Name: p.Name, Version: p.Version, PackageURL: purl, Scope: cdx.ScopeRequired})
		}
		sort.Strings(on)
		deps = append(deps, cdx.Dependency{Ref: ref, Dependencies: &on})
	}
	bom.Components, bom.Dependencies = &components, &deps
	return nil
}
