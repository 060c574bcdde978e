package sources

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/internal/filewatch"
)

// KubeconfigSource is the name of the kubeconfig source.
const KubeconfigSource = "kubeconfig"

// kubeconfigCheck is how often the kubeconfig file is re-read (and
// compared by digest, as filewatch does): contexts added, removed or given
// new credentials apply within that time, without a restart.
const kubeconfigCheck = 2 * time.Second

// KubeconfigOptions configures the kubeconfig source.
type KubeconfigOptions struct {
	// Path is the kubeconfig file; empty means $KUBECONFIG or
	// ~/.kube/config.
	Path string
	// Contexts, if set, are the contexts to collect; otherwise every
	// context is a cluster.
	Contexts []string
	// Labels are the clusters' labels by context; the labels under ""
	// apply to every context (a context's own win).
	Labels map[string]map[string]string
	Logger *slog.Logger
}

// NewKubeconfig returns the source of a kubeconfig file's contexts: each
// context is a cluster named after it, with the labels given for it. The
// file is watched: a new context is added, a removed one is removed, and a
// context whose cluster or user entry changed reconnects. A file that
// stops parsing keeps the clusters as they were, and the error is logged.
func NewKubeconfig(opts KubeconfigOptions) Source { return &kubeconfigSource{opts: opts} }

type kubeconfigSource struct{ opts KubeconfigOptions }

func (s *kubeconfigSource) Name() string { return KubeconfigSource }

func (s *kubeconfigSource) Run(ctx context.Context, r *Registry) error {
	log := logger(s.opts.Logger)
	claims, err := s.claims()
	if err != nil {
		return err
	}
	w := newWatcher(KubeconfigSource, r, log)
	// Any new content of the file recomputes the claims.
	file := filewatch.New(s.path(), func([]byte) error {
		select {
		case w.kick <- struct{}{}:
		default:
		}
		return nil
	})
	if err := file.Load(); err != nil {
		return err
	}
	fctx, stop := context.WithCancel(ctx)
	fileDone := make(chan struct{})
	go func() {
		defer close(fileDone)
		file.Run(fctx, kubeconfigCheck, func(err error) {
			w.log.Error("kubeconfig cannot be read; keeping its clusters as they were", "err", err)
		})
	}()
	defer func() { stop(); <-fileDone }()
	first := true
	return w.run(ctx, func() []Claim {
		if first {
			first = false
			return claims
		}
		next, err := s.claims()
		if err != nil {
			w.log.Error("kubeconfig changed but cannot be read; keeping its clusters as they were", "err", err)
			return claims
		}
		claims = next
		return claims
	})
}

// path is the file the source reads.
func (s *kubeconfigSource) path() string {
	if s.opts.Path != "" {
		return s.opts.Path
	}
	return clientcmd.NewDefaultClientConfigLoadingRules().GetDefaultFilename()
}

// claims reads the file and returns a claim per context.
func (s *kubeconfigSource) claims() ([]Claim, error) {
	specs, err := connection.KubeconfigSpecs(s.opts.Path, nil)
	if err != nil {
		return nil, err
	}
	raw, err := s.rules().Load()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	byName := map[string]connection.Spec{}
	for _, sp := range specs {
		byName[sp.Name] = sp
	}
	names := s.opts.Contexts
	if len(names) == 0 {
		names = make([]string, 0, len(specs))
		for _, sp := range specs {
			names = append(names, sp.Name)
		}
	}
	out := make([]Claim, 0, len(names))
	for _, name := range names {
		labels := maps.Clone(s.opts.Labels[""])
		if labels == nil {
			labels = map[string]string{}
		}
		maps.Copy(labels, s.opts.Labels[name])
		labels[SourceLabel] = KubeconfigSource
		c := Claim{Object: name, Cluster: name, Labels: labels}
		sp, ok := byName[name]
		if !ok {
			c.Config, c.Version = failing(fmt.Errorf("the kubeconfig has no context %q any more", name)), "absent"
			out = append(out, c)
			continue
		}
		c.Config = sp.Config
		c.Version = contextVersion(raw, name)
		out = append(out, c)
	}
	return out, nil
}

func (s *kubeconfigSource) rules() *clientcmd.ClientConfigLoadingRules {
	if s.opts.Path != "" {
		return &clientcmd.ClientConfigLoadingRules{ExplicitPath: s.opts.Path}
	}
	return clientcmd.NewDefaultClientConfigLoadingRules()
}

// contextVersion hashes what a context connects with: the context, its
// cluster and its user entries.
func contextVersion(raw *clientcmdapi.Config, name string) string {
	ctx := raw.Contexts[name]
	var parts []any
	if ctx != nil {
		parts = append(parts, ctx, raw.Clusters[ctx.Cluster], raw.AuthInfos[ctx.AuthInfo])
	}
	data, err := json.Marshal(parts)
	if err != nil {
		return "unversioned"
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}
