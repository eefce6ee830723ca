package release

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	cdx "github.com/CycloneDX/cyclonedx-go"
)

// The SBOM lists each image of the bundle as a container component, with the digest of its
// configuration, that depends on the Debian packages installed in it: the Mosquitto image on
// Debian's mosquitto and libc6, as pkg:deb purls with their architecture and distribution, the
// versions its dpkg database holds.
func TestSBOMListsTheImagesDebianPackages(t *testing.T) {
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
	if bom.Components == nil || bom.Dependencies == nil {
		t.Fatal("the SBOM has no components or no dependencies")
	}
	byRef := map[string]cdx.Component{}
	for _, c := range *bom.Components {
		byRef[c.BOMRef] = c
	}
	dependsOn := map[string][]string{}
	for _, d := range *bom.Dependencies {
		if d.Dependencies != nil {
			dependsOn[d.Ref] = *d.Dependencies
		}
	}
	for name, image := range images {
		c, ok := byRef["image:"+image]
		if !ok || c.Type != cdx.ComponentTypeContainer {
			t.Errorf("image %s (%s): no container component in the SBOM", name, image)
			continue
		}
		if c.Hashes == nil || len(*c.Hashes) != 1 || len((*c.Hashes)[0].Value) != 64 {
			t.Errorf("image %s: no sha256 of its configuration: %+v", name, c.Hashes)
		}
	}
	mosquitto := dependsOn["image:"+images["mosquitto"]]
	for _, pkg := range []string{"mosquitto", "libc6"} {
		i := slices.IndexFunc(mosquitto, func(ref string) bool { return strings.HasPrefix(ref, "pkg:deb/debian/"+pkg+"@") })
		if i < 0 {
			t.Errorf("the Mosquitto image's Debian packages (%d) do not include %s", len(mosquitto), pkg)
			continue
		}
		c := byRef[mosquitto[i]]
		if c.Name != pkg || c.Version == "" || c.PackageURL != mosquitto[i] ||
			!strings.Contains(c.PackageURL, "@"+c.Version+"?") || !strings.Contains(c.PackageURL, "arch=") || !strings.Contains(c.PackageURL, "distro=debian-") {
			t.Errorf("%s: component %+v, want name, version and a pkg:deb purl with arch and distro", pkg, c)
			continue
		}
		t.Logf("the Mosquitto image holds %s", c.PackageURL)
	}
	t.Logf("the Mosquitto image: %d Debian packages in the SBOM", len(mosquitto))
}
