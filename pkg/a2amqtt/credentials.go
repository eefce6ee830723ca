package a2amqtt

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// Credentials files and variables. The operator's credentials Secret holds exactly these keys, so a
// Secret mounted as a volume is a credentials folder.
const (
	// CredentialsFileUsername, CredentialsFilePassword and CredentialsFileClientID are the files of
	// a credentials folder (the keys of the Agent's credentials Secret); the client ID is optional.
	CredentialsFileUsername = "username"
	CredentialsFilePassword = "password"
	CredentialsFileClientID = "clientID"
	// EnvCredentialsDir names a credentials folder (the operator sets it in workloads, where the
	// Secret is mounted).
	EnvCredentialsDir = "A2A_CREDENTIALS_DIR"
)

// CredentialSource supplies the username and password of every CONNECT attempt. A Conn asks at
// every attempt, so a source that returns what is current makes a rotated password take effect at
// the next reconnect: after the broker disconnected the client for the rotation, or refused a
// CONNECT with the old one.
type CredentialSource interface {
	// Credentials returns the username and password to present now.
	Credentials() (username string, password []byte, err error)
}

// StaticCredentials is a fixed username and password.
type StaticCredentials struct {
	Username string
	Password []byte
}

// Credentials implements CredentialSource.
func (s StaticCredentials) Credentials() (string, []byte, error) { return s.Username, s.Password, nil }

// CredentialsDir reads the credentials folder dir (files username and password, as a mounted
// Secret has them) at every CONNECT attempt, so a rotated Secret is used at the next attempt; a
// Secret volume's atomic update (kubelet's ..data symlink swap) is never read half-written. When a
// file cannot be read (the folder is being replaced, or is not there yet), the last credentials
// read are used and the error is reported once they are needed for the first time.
func CredentialsDir(dir string) *DirCredentials { return &DirCredentials{dir: dir} }

// DirCredentials is the CredentialSource of CredentialsDir.
type DirCredentials struct {
	dir  string
	mu   sync.Mutex
	user string
	pass []byte
	read bool
}

// Dir is the folder read.
func (d *DirCredentials) Dir() string { return d.dir }

// Credentials implements CredentialSource.
func (d *DirCredentials) Credentials() (string, []byte, error) {
	user, errU := os.ReadFile(filepath.Join(d.dir, CredentialsFileUsername))
	pass, errP := os.ReadFile(filepath.Join(d.dir, CredentialsFilePassword))
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := errors.Join(errU, errP); err != nil {
		if d.read {
			return d.user, d.pass, nil
		}
		return "", nil, fmt.Errorf("a2amqtt: read credentials in %s: %w", d.dir, err)
	}
	d.user, d.pass, d.read = string(bytes.TrimSpace(user)), bytes.TrimSpace(pass), true
	return d.user, d.pass, nil
}

// ClientID returns the client ID file of the folder ("" when it has none).
func (d *DirCredentials) ClientID() string {
	raw, err := os.ReadFile(filepath.Join(d.dir, CredentialsFileClientID))
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(raw))
}

// WriteCredentialsDir replaces the contents of the credentials folder dir with files (name to
// content) atomically, the way the kubelet updates a Secret volume: the files are symlinks into
// ..data, itself a symlink swapped in one rename to a new folder, so a reader (CredentialsDir)
// sees either the old or the new set, never a mix. For processes that keep a Secret in a folder
// themselves (a sync loop, `make dev`).
func WriteCredentialsDir(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("a2amqtt: credentials folder: %w", err)
	}
	ts, err := os.MkdirTemp(dir, "..ts-")
	if err != nil {
		return fmt.Errorf("a2amqtt: credentials folder: %w", err)
	}
	for name, v := range files {
		if err := os.WriteFile(filepath.Join(ts, name), v, 0o600); err != nil {
			return fmt.Errorf("a2amqtt: credentials folder: %w", err)
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		return fmt.Errorf("a2amqtt: credentials folder: %w", err)
	}
	data := filepath.Join(dir, "..data")
	previous, _ := os.Readlink(data)
	if err := os.Rename(tmp, data); err != nil {
		return fmt.Errorf("a2amqtt: credentials folder: %w", err)
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if target, err := os.Readlink(link); err == nil && target == filepath.Join("..data", name) {
			continue
		}
		_ = os.Remove(link)
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			return fmt.Errorf("a2amqtt: credentials folder: %w", err)
		}
	}
	if previous != "" && previous != filepath.Base(ts) {
		_ = os.RemoveAll(filepath.Join(dir, previous))
	}
	return nil
}
