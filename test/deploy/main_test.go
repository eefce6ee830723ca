package deploy

import (
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
)

func TestMain(m *testing.M) {
	// The control plane's own client logs nothing worth reading here; the pods' logs are files.
	ctrl.SetLogger(logr.Discard())
	os.Exit(m.Run())
}
