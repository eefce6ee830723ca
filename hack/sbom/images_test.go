package main

import (
	"strings"
	"testing"
)

// dpkg's status keeps removed packages' entries (Status: deinstall ok config-files) and folds
// long fields over continuation lines; only installed packages are listed, with their source.
func TestParseDpkgStatus(t *testing.T) {
	status := `Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc
Version: 2.36-9+deb12u14
Description: GNU C Library: Shared libraries
 Contains the standard libraries that are used by nearly all programs on
 the system.

Package: removed-one
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: mosquitto
Status: install ok installed
Architecture: amd64
Version: 2.0.11-1.2+deb12u2
`
	pkgs, err := parseDpkgStatus(strings.NewReader(status))
	if err != nil {
		t.Fatal(err)
	}
	want := []debPackage{
		{Name: "libc6", Version: "2.36-9+deb12u14", Arch: "amd64", Source: "glibc"},
		{Name: "mosquitto", Version: "2.0.11-1.2+deb12u2", Arch: "amd64"},
	}
	if len(pkgs) != len(want) || pkgs[0] != want[0] || pkgs[1] != want[1] {
		t.Fatalf("parsed %+v, want %+v", pkgs, want)
	}
	if got, w := debPurl(pkgs[0], "debian-12"), "pkg:deb/debian/libc6@2.36-9+deb12u14?arch=amd64&distro=debian-12&upstream=glibc"; got != w {
		t.Errorf("purl %s, want %s", got, w)
	}
}
