package connection

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"slices"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Spec describes one cluster to collect from.
type Spec struct {
	// Name identifies the cluster everywhere in fleetgraph.
	Name string
	// Labels are the cluster's labels, shown in the API.
	Labels map[string]string
	// Config builds a fresh client config. It is called on every connect
	// and reconnect, so rotated credentials are picked up; an error is
	// reported on the cluster and retried with backoff.
	Config func(ctx context.Context) (*rest.Config, error)
}

// ErrNoContexts is returned for a kubeconfig without contexts.
var ErrNoContexts = errors.New("kubeconfig has no contexts")

// KubeconfigSpecs returns one Spec per context of a kubeconfig file, or per
// named context. The file must parse; a context that is broken (a missing
// cluster or user entry, an unreadable certificate file) yields a Spec whose
// Config fails with a clear error, so one bad context never stops the
// others. Each Config call re-reads the file.
func KubeconfigSpecs(path string, contexts []string) ([]Spec, error) {
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: path}
	if path == "" {
		rules = clientcmd.NewDefaultClientConfigLoadingRules()
	}
	raw, err := rules.Load()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	names := slices.Sorted(maps.Keys(raw.Contexts))
	if len(contexts) > 0 {
		for _, c := range contexts {
			if _, ok := raw.Contexts[c]; !ok {
				return nil, fmt.Errorf("kubeconfig has no context %q (it has %v)", c, names)
			}
		}
		names = contexts
	}
	if len(names) == 0 {
		return nil, ErrNoContexts
	}
	specs := make([]Spec, 0, len(names))
	for _, name := range names {
		specs = append(specs, Spec{
			Name: name,
			Config: func(context.Context) (*rest.Config, error) {
				loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: name})
				raw, err := loader.RawConfig()
				if err != nil {
					return nil, fmt.Errorf("kubeconfig context %q: %w", name, err)
				}
				if err := checkContext(&raw, name); err != nil {
					return nil, err
				}
				cfg, err := loader.ClientConfig()
				if err != nil {
					return nil, fmt.Errorf("kubeconfig context %q: %w", name, err)
				}
				return cfg, nil
			},
		})
	}
	return specs, nil
}

// checkContext reports a context that names a cluster or user the
// kubeconfig does not define. clientcmd would quietly fall back to no
// credentials, and the cluster would then fail with an unhelpful 403.
func checkContext(raw *clientcmdapi.Config, name string) error {
	c, ok := raw.Contexts[name]
	if !ok {
		return fmt.Errorf("kubeconfig has no context %q", name)
	}
	if _, ok := raw.Clusters[c.Cluster]; !ok {
		return fmt.Errorf("kubeconfig context %q names cluster %q, which the kubeconfig does not define", name, c.Cluster)
	}
	if _, ok := raw.AuthInfos[c.AuthInfo]; c.AuthInfo != "" && !ok {
		return fmt.Errorf("kubeconfig context %q names user %q, which the kubeconfig does not define", name, c.AuthInfo)
	}
	return nil
}

// ErrNoCurrentContext is returned for a kubeconfig that names no current
// context: clusters from sources use the current context, and guessing
// another one would connect with credentials nobody chose.
var ErrNoCurrentContext = errors.New("kubeconfig has no current context")

// KubeconfigConfig parses a kubeconfig and returns the client config of its
// current context. A kubeconfig that does not parse, names no current
// context, names a cluster or user it does not define, or holds a CA that
// is not PEM is an error that says which.
func KubeconfigConfig(data []byte) (*rest.Config, error) {
	if len(data) == 0 {
		return nil, errors.New("empty kubeconfig")
	}
	raw, err := clientcmd.Load(data)
	if err != nil {
		return nil, fmt.Errorf("parse kubeconfig: %w", err)
	}
	if raw.CurrentContext == "" {
		return nil, ErrNoCurrentContext
	}
	if err := checkContext(raw, raw.CurrentContext); err != nil {
		return nil, err
	}
	cfg, err := clientcmd.NewDefaultClientConfig(*raw, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	if err := CheckCA(cfg); err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}

// CheckCA rejects a config whose CA data holds no PEM certificate. client-go
// accepts it and fails later, when building a transport, with an error that
// does not say which source is at fault.
func CheckCA(cfg *rest.Config) error {
	if len(cfg.CAData) == 0 {
		return nil
	}
	if !x509.NewCertPool().AppendCertsFromPEM(cfg.CAData) {
		return errors.New("the certificate authority data holds no PEM certificate")
	}
	return nil
}
