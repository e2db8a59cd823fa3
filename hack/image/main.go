// Command image builds the manager's and the survivor's container images
// without Docker, and the pause image the local node's sandboxes use:
//
//	go run ./hack/image [-out bin/image/iteron-operator.tar] [-tag iteron-operator:dev]
//	                    [-survivor-out bin/image/iteron-survivor.tar] [-survivor-tag iteron-survivor:dev]
//	                    [-pause-out bin/image/pause.tar] [-pause-tag localhost/iteron-pause:1]
//
// The manager image has the same content as the Dockerfile's: the static
// manager as /manager (the entrypoint, run as 0:0), the static kubectl-iteron
// in /usr/local/bin, and a POSIX /bin/sh for provider scripts (the manager's
// default --interpreters) from Debian's busybox-static package, unpacked with
// dpkg-deb -x, with its applets linked as `busybox --install -s` would; plus
// the mount points of config/manager/daemonset.yaml, which a read-only root
// file system cannot create at run time. The survivor image
// (config/manager/survivor.yaml) has the same busybox layer (providers'
// scripts run in its container) and the static iteron-survivor as
// /iteron-survivor, its entrypoint. The pause image holds hack/image/pause
// alone.
//
// Each image is an OCI image (OCI manifest, config and layer media types)
// written as an image tarball (go-containerregistry's tarball format, the one
// `docker save` writes): `ctr -n k8s.io images import`, `docker load` and
// `kind load image-archive` all read it. Layers are built with fixed times and
// owners, so the same sources give the same digests. Nothing is pulled from a
// registry; the .deb comes from Debian's archive through apt (kept in
// bin/image/debs).
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func main() {
	out := flag.String("out", "bin/image/iteron-operator.tar", "the manager image's tarball (empty: do not build it)")
	tag := flag.String("tag", "iteron-operator:dev", "the manager image's name (config/manager/daemonset.yaml names iteron-operator:dev)")
	survivorOut := flag.String("survivor-out", "bin/image/iteron-survivor.tar", "the survivor image's tarball (empty: do not build it)")
	survivorTag := flag.String("survivor-tag", "iteron-survivor:dev", "the survivor image's name (config/manager/survivor.yaml names iteron-survivor:dev)")
	pauseOut := flag.String("pause-out", "bin/image/pause.tar", "the pause image's tarball (empty: do not build it)")
	pauseTag := flag.String("pause-tag", "localhost/iteron-pause:1", "the pause image's name (the local node's containerd names it as its sandbox image)")
	debs := flag.String("debs", "bin/image/debs", "where busybox-static's .deb is kept (fetched with `apt-get download` when missing)")
	note := flag.String("manager-note", "", "set the manager's main.buildNote (-ldflags -X): another build of the same source, as a new release's image (test/node's upgrade)")
	offline := flag.Bool("offline", false, "fetch nothing: fail when busybox-static's .deb is not in -debs yet (test/node; `make image` fetches it)")
	flag.Parse()
	if err := run(*out, *tag, *survivorOut, *survivorTag, *pauseOut, *pauseTag, *debs, *note, *offline); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(out, tag, survivorOut, survivorTag, pauseOut, pauseTag, debs, note string, offline bool) error {
	start := time.Now()
	work, err := os.MkdirTemp("", "iteron-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	bins := map[string]string{}
	if out != "" {
		bins["manager"], bins["kubectl-iteron"] = "./cmd/manager", "./cmd/kubectl-iteron"
	}
	if survivorOut != "" {
		bins["iteron-survivor"] = "./cmd/survivor"
	}
	if out != "" || survivorOut != "" {
		// The sandbox launcher, beside the manager and the survivor (their
		// --sandbox-launcher default).
		bins["iteron-sandbox"] = "./cmd/iteron-sandbox"
	}
	if pauseOut != "" {
		bins["pause"] = "./hack/image/pause"
	}
	for _, bin := range []string{"manager", "kubectl-iteron", "iteron-survivor", "iteron-sandbox", "pause"} {
		if bins[bin] == "" {
			continue
		}
		fmt.Printf("image: building %s (static)\n", bin)
		ldflags := "-s -w"
		if bin == "manager" && note != "" {
			ldflags += " -X main.buildNote=" + note
		}
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags="+ldflags, "-o", filepath.Join(work, bin), bins[bin])
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go build %s: %w", bins[bin], err)
		}
	}
	if out != "" || survivorOut != "" {
		base, err := baseLayer(work, debs, offline)
		if err != nil {
			return err
		}
		if out != "" {
			if err := managerImage(work, base, out, tag); err != nil {
				return err
			}
		}
		if survivorOut != "" {
			if err := survivorImage(work, base, survivorOut, survivorTag); err != nil {
				return err
			}
		}
	}
	if pauseOut != "" {
		pause, err := image([][]entry{{{path: "pause", mode: 0o755, file: filepath.Join(work, "pause")}}}, v1.Config{Entrypoint: []string{"/pause"}, User: "65535:65535"})
		if err != nil {
			return err
		}
		if err := write(pauseOut, pauseTag, pause); err != nil {
			return err
		}
	}
	fmt.Printf("image: done in %s\n", time.Since(start).Round(time.Second))
	return nil
}

// baseLayer is the first layer of the manager's and the survivor's images:
// busybox and the mount points (it changes only with Debian's package).
func baseLayer(work, debs string, offline bool) ([]entry, error) {
	busybox, err := unpackBusybox(debs, work, offline)
	if err != nil {
		return nil, err
	}
	applets, err := busyboxApplets(busybox)
	if err != nil {
		return nil, err
	}
	base := []entry{
		{path: "bin/busybox", mode: 0o755, file: busybox},
		{path: "tmp", mode: 0o1777, dir: true},
		{path: "var/lib/iteron/state", mode: 0o755, dir: true},
		{path: "var/lib/iteron/providers", mode: 0o755, dir: true},
		{path: "run/iteron", mode: 0o755, dir: true},
	}
	for _, a := range applets {
		if a == "bin/busybox" {
			continue
		}
		target, err := filepath.Rel(path.Dir("/"+a), "/bin/busybox")
		if err != nil {
			return nil, err
		}
		base = append(base, entry{path: a, link: target})
	}
	return base, nil
}

// managerImage writes the manager's image (see the command's doc): the base
// layer, then the binaries of this repository.
func managerImage(work string, base []entry, out, tag string) error {
	own := []entry{
		{path: "manager", mode: 0o755, file: filepath.Join(work, "manager")},
		{path: "usr/local/bin/kubectl-iteron", mode: 0o755, file: filepath.Join(work, "kubectl-iteron")},
		{path: "iteron-sandbox", mode: 0o755, file: filepath.Join(work, "iteron-sandbox")},
	}
	img, err := image([][]entry{base, own}, v1.Config{
		Entrypoint: []string{"/manager"},
		User:       "0:0",
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "iteron-operator",
			"org.opencontainers.image.description": "the iteron manager (DaemonSet) and the kubectl-iteron CLI",
		},
	})
	if err != nil {
		return err
	}
	return write(out, tag, img)
}

// survivorImage writes the survivor's image: the base layer (its /bin/sh
// runs provider scripts), then /iteron-survivor and the sandbox launcher
// beside it.
func survivorImage(work string, base []entry, out, tag string) error {
	own := []entry{
		{path: "iteron-survivor", mode: 0o755, file: filepath.Join(work, "iteron-survivor")},
		{path: "iteron-sandbox", mode: 0o755, file: filepath.Join(work, "iteron-sandbox")},
	}
	img, err := image([][]entry{base, own}, v1.Config{
		Entrypoint: []string{"/iteron-survivor"},
		User:       "0:0",
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "iteron-survivor",
			"org.opencontainers.image.description": "the iteron survivor (DaemonSet): owns a node's provider processes across manager restarts",
		},
	})
	if err != nil {
		return err
	}
	return write(out, tag, img)
}

// unpackBusybox returns the path of busybox-static's /bin/busybox, unpacked
// from its .deb (fetched into debs with `apt-get download` when none is there).
func unpackBusybox(debs, work string, offline bool) (string, error) {
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return "", err
	}
	find := func() string {
		m, _ := filepath.Glob(filepath.Join(debs, "busybox-static_*.deb"))
		sort.Strings(m)
		if len(m) == 0 {
			return ""
		}
		return m[len(m)-1]
	}
	deb := find()
	if deb == "" && offline {
		return "", fmt.Errorf("no busybox-static_*.deb in %s, and -offline fetches nothing: run `make image` once", debs)
	}
	if deb == "" {
		fmt.Println("image: fetching Debian's busybox-static package (apt-get download)")
		cmd := exec.Command("apt-get", "download", "busybox-static")
		cmd.Dir, cmd.Stdout, cmd.Stderr = debs, os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			// A machine that never ran `apt-get update` knows no package lists yet.
			upd := exec.Command("apt-get", "update", "-q")
			upd.Stdout, upd.Stderr = os.Stdout, os.Stderr
			if uerr := upd.Run(); uerr != nil {
				return "", fmt.Errorf("apt-get download busybox-static: %v; apt-get update: %w", err, uerr)
			}
			cmd = exec.Command("apt-get", "download", "busybox-static")
			cmd.Dir, cmd.Stdout, cmd.Stderr = debs, os.Stdout, os.Stderr
			if err := cmd.Run(); err != nil {
				return "", fmt.Errorf("apt-get download busybox-static: %w", err)
			}
		}
		if deb = find(); deb == "" {
			return "", errors.New("apt-get download busybox-static left no busybox-static_*.deb")
		}
	}
	dir := filepath.Join(work, "busybox-static")
	if out, err := exec.Command("dpkg-deb", "-x", deb, dir).CombinedOutput(); err != nil {
		return "", fmt.Errorf("dpkg-deb -x %s: %v\n%s", deb, err, out)
	}
	bb := filepath.Join(dir, "bin", "busybox")
	if _, err := os.Stat(bb); err != nil {
		return "", fmt.Errorf("%s has no bin/busybox: %w", deb, err)
	}
	fmt.Printf("image: /bin/sh is busybox from %s\n", filepath.Base(deb))
	return bb, nil
}

// busyboxApplets lists where `busybox --install -s` would link each applet
// (bin/sh, usr/bin/env, ...), without a leading slash.
func busyboxApplets(busybox string) ([]string, error) {
	out, err := exec.Command(busybox, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list-full: %w", busybox, err)
	}
	var applets []string
	seen := map[string]bool{}
	for _, a := range strings.Fields(string(out)) {
		a = strings.TrimPrefix(path.Clean("/"+a), "/")
		if !seen[a] {
			seen[a] = true
			applets = append(applets, a)
		}
	}
	if !seen["bin/sh"] {
		return nil, errors.New("busybox has no sh applet")
	}
	return applets, nil
}

// entry is one file, directory or symlink of a layer.
type entry struct {
	path string
	mode int64
	dir  bool
	link string // symlink target
	file string // regular file: the file to copy
}

// epoch is every entry's time: the same inputs give the same layer digests.
var epoch = time.Unix(0, 0).UTC()

// layer writes entries (their parent directories first) as an uncompressed
// tar and wraps it as an OCI layer.
func layer(entries []entry) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	var mkdirs func(string) error
	mkdirs = func(d string) error {
		if d == "." || d == "/" || dirs[d] {
			return nil
		}
		if err := mkdirs(path.Dir(d)); err != nil {
			return err
		}
		dirs[d] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].path < entries[j].path })
	for _, e := range entries {
		if err := mkdirs(path.Dir(e.path)); err != nil {
			return nil, err
		}
		switch {
		case e.dir:
			if dirs[e.path] {
				continue
			}
			dirs[e.path] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: e.path + "/", Mode: e.mode, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		case e.link != "":
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: e.path, Linkname: e.link, Mode: 0o777, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		default:
			data, err := os.ReadFile(e.file)
			if err != nil {
				return nil, err
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.path, Mode: e.mode, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
			if _, err := tw.Write(data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// image stacks the layers on an empty OCI image with the given config.
func image(layers [][]entry, cfg v1.Config) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, entries := range layers {
		l, err := layer(entries)
		if err != nil {
			return nil, err
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			return nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: epoch}
	cf.Config = cfg
	return mutate.ConfigFile(img, cf)
}

func write(out, tag string, img v1.Image) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("image name %q: %w", tag, err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	st, err := os.Stat(out)
	if err != nil {
		return err
	}
	fmt.Printf("image: wrote %s (%s, %s, %.1f MB)\n", out, ref.Name(), digest, float64(st.Size())/1e6)
	return nil
}
