package embedded

import (
	"bytes"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"fmt"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// credential is one user's password, in two forms:
//
//   - at rest (the snapshot) a PBKDF2-SHA512 hash, the scheme dynsec stores;
//   - in memory a keyed digest, HMAC-SHA256 under a random per-process key,
//     of salt and password: CONNECT is checked against it in microseconds.
//
// PBKDF2 is slow on purpose and protects a snapshot file that leaks; it adds
// nothing in memory, where the process (the operator, in `make dev`) holds
// the plaintext Secrets anyway. So it is computed once per credential change
// and only when a snapshot is kept, by the snapshot writer, never while a
// command or a CONNECT waits. A credential loaded from a snapshot has no
// digest until its first successful CONNECT, which verifies PBKDF2 once and
// caches the digest; a password change replaces the whole credential, so a
// cached digest can never outlive its password.
type credential struct {
	Salt       []byte `json:"salt"`
	Iterations int    `json:"iterations"`
	Hash       []byte `json:"hash"`

	// digest is the in-memory verifier (nil until known).
	digest []byte
	// pending is the plaintext until the snapshot writer has hashed it
	// (only set when a snapshot is kept; never written anywhere).
	pending string
}

// verifierKey keys the in-memory digests of one store.
type verifierKey [32]byte

func newVerifierKey() (verifierKey, error) {
	var k verifierKey
	if _, err := rand.Read(k[:]); err != nil {
		return k, fmt.Errorf("verifier key: %w", err)
	}
	return k, nil
}

func (k *verifierKey) digest(salt []byte, password string) []byte {
	m := hmac.New(sha256.New, k[:])
	m.Write(salt)
	m.Write([]byte(password))
	return m.Sum(nil)
}

// newCredential makes the fast form at once; the PBKDF2 form is left to the
// snapshot writer when keepPlaintext says one is kept.
func newCredential(k *verifierKey, password string, keepPlaintext bool) (*credential, error) {
	salt := make([]byte, 12)
	if _, err := rand.Read(salt); err != nil {
		return nil, fmt.Errorf("password salt: %w", err)
	}
	c := &credential{Salt: salt, digest: k.digest(salt, password)}
	if keepPlaintext {
		c.pending = password
	}
	return c, nil
}

// HashPassword returns password's at-rest form with a new salt (PBKDF2-SHA512,
// DefaultIterations): a sender attaches it to the command that sets the password
// (acl.Command.PasswordHash), so that the stores the command reaches take it instead of each
// computing its own (the slow part of a new client's cost).
func HashPassword(password string) (*acl.PasswordHash, error) {
	salt := make([]byte, 12)
	if _, err := rand.Read(salt); err != nil {
		return nil, fmt.Errorf("password salt: %w", err)
	}
	h, err := hashed(password, salt, DefaultIterations)
	if err != nil {
		return nil, err
	}
	return &acl.PasswordHash{Salt: salt, Iterations: DefaultIterations, Hash: h}, nil
}

// withHash gives c the at-rest form h, when h is at least as strong as the store's own
// (iterations, salt and hash lengths): nothing is left to hash. A weaker one is ignored and
// the store hashes the password itself. The form is taken as the sender's word that it is
// the password's: only the table's admin sends commands, and it sets the password anyway.
func (c *credential) withHash(k *verifierKey, password string, h *acl.PasswordHash, iterations int) {
	if h == nil || h.Iterations < iterations || len(h.Salt) < 12 || len(h.Hash) != 64 {
		return
	}
	c.Salt, c.Iterations, c.Hash = bytes.Clone(h.Salt), h.Iterations, bytes.Clone(h.Hash)
	c.digest, c.pending = k.digest(c.Salt, password), ""
}

// hashed returns the PBKDF2 form of a pending credential (slow; call
// without locks held).
func hashed(password string, salt []byte, iterations int) ([]byte, error) {
	h, err := pbkdf2.Key(sha512.New, password, salt, iterations, 64)
	if err != nil {
		return nil, fmt.Errorf("password hash: %w", err)
	}
	return h, nil
}

// quickMatch checks password against the in-memory digest. known is false
// when there is no digest yet (a credential loaded from a snapshot).
func (c *credential) quickMatch(k *verifierKey, password string) (ok, known bool) {
	if c.digest == nil {
		return false, false
	}
	return subtle.ConstantTimeCompare(c.digest, k.digest(c.Salt, password)) == 1, true
}

// slowMatch verifies password against the PBKDF2 hash.
func (c *credential) slowMatch(password string) bool {
	if len(c.Hash) == 0 || c.Iterations < 1 {
		return false
	}
	h, err := pbkdf2.Key(sha512.New, password, c.Salt, c.Iterations, len(c.Hash))
	return err == nil && subtle.ConstantTimeCompare(h, c.Hash) == 1
}
