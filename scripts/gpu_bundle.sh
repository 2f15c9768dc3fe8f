#!/usr/bin/env bash
# Packs what strata's build needs on the GPU machine that the machine does not have itself, into
# gpu_bundle/ (git-ignored), for scripts/gpu_check.sh to unpack there (docs/gpu.md):
#
#   scripts/gpu_bundle.sh            # here, on Debian 12, as root (apt-get download; nothing installed)
#   then the device tool: run with carry ["gpu_bundle"], command `bash scripts/gpu_check.sh`
#
# The GPU machine (docs/gpu.md) has no package registry. Its image brings nvcc and the CUDA
# libraries, a C/C++ compiler (nvcc needs one), CMake, ninja and Python with PyTorch; it lacks the
# Debian packages of scripts/packages.sh. Those are fetched here with `apt-get download` (the
# .deb files as Debian ships them), so that the other side can `dpkg -x` them into a prefix and
# build against it. What is fetched, from scripts/packages.sh's list:
#   - the development packages, alone (not their own Depends, which pull gfortran, autotools and
#     the -dev packages of every library OpenMPI links): libopenmpi-dev (mpi.h, libmpi.so),
#     libdnnl-dev, nlohmann-json3-dev, libcli11-dev, libgtest-dev (static gtest + CMake config),
#     libpcre2-dev, libprotobuf-dev and protobuf-compiler (the TensorBoard monitor);
#   - the runtime libraries behind them, with their Depends followed recursively: libopenmpi3,
#     openmpi-bin (mpirun, the wrapper compilers), openmpi-common (its help texts), libdnnl2 (and
#     libOpenCL.so.1, which libdnnl.so links), libpcre2-*, libprotobuf*, libprotoc32, zlib1g-dev;
#   - minus what every glibc Linux with a C++ compiler has (libc6, libstdc++6, libgcc-s1, libgomp1,
#     zlib, ...) and what a one-host build and test do not use (openssh-client, hwloc's optional
#     plugins and their X11/libxml2/ICU, the InfiniBand providers, debconf, perl, PAM).
# Left out on purpose from scripts/packages.sh: cmake, g++, make, python3, python3-venv and
# iproute2 (the GPU machine's own are used); libcairo2-dev and pkg-config (strata report, which
# gpu_check.sh configures out with -DSTRATA_REPORT=OFF: cairo's X11, fontconfig and freetype
# stack would not fit the bundle, and a report is made wherever the run directory is copied). gpu_check.sh drops any bundled library whose soname
# the machine already resolves, so that its own newer copy wins.
#
# Each .deb is then slimmed: usr/share/{doc,man,info,lintian,locale} and the documentation
# dirs are removed and the package rebuilt under its own file name (dpkg-deb -b, xz); the
# original size, the slim size and the sha256 of each are in gpu_bundle/MANIFEST.txt.
# Fails if the bundle is over GPU_BUNDLE_MAX_MIB (default 60: the device tool carries 64 MiB in
# all, working tree included).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
bundle=$root/gpu_bundle
max_mib=${GPU_BUNDLE_MAX_MIB:-60}

# shellcheck source-path=SCRIPTDIR source=packages.sh
. scripts/packages.sh

# scripts/packages.sh's list, sorted into what the bundle takes and what the GPU machine brings.
given=(cmake g++ make iproute2 python3 python3-venv)
not_bundled=(libcairo2-dev pkg-config)  # strata report's; configured out on the GPU machine
dev_only=()
for p in "${strata_packages[@]}"; do
  case " ${given[*]} ${not_bundled[*]} " in *" $p "*) continue ;; esac
  case $p in
    openmpi-bin) ;;            # a runtime root below
    *) dev_only+=("$p") ;;
  esac
done
runtime_roots=(libopenmpi3 openmpi-bin openmpi-common libdnnl2 ocl-icd-libopencl1
               libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
               libprotobuf32 libprotobuf-lite32 libprotoc32 zlib1g-dev)
# Not followed and not fetched: the base system every such machine has, and what the build and a
# one-host test run never load.
exclude_re='^(libc6|libc-bin|libgcc-s1|libstdc\+\+6|gcc-[0-9]+-base|libgomp1|libatomic1|zlib1g|libzstd1|liblzma5|libbz2-1\.0|libcrypt1|libselinux1|libudev1|libuuid1|libtinfo6|libssl3|libffi8|libgmp10|libmd0|libbsd0|libacl1|libcap-ng0|libaudit1|libaudit-common|libpam.*|libsemanage.*|libsepol2|libdb5\.3|libgdbm.*|perl.*|libperl.*|debconf|cdebconf|debianutils|dpkg|tar|adduser|passwd|install-info|readline-common|libreadline8|libslang2|libnewt0\.52|libtextwrap1|libdebian-installer4|openssh-client|libedit2|libfido2-1|libcbor0\.8|libgssapi-krb5-2|libkrb5.*|libk5crypto3|libcom-err2|libkeyutils1|libhwloc-plugins|ibverbs-providers|libxml2|libicu[0-9]+|libx11-.*|libx11-6|libxau6|libxcb1|libxdmcp6|libxext6|libxnvctrl0|libpciaccess0)$'

if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
  echo "gpu_bundle.sh: needs apt-get and dpkg-deb (Debian 12, like this repository's CI)" >&2
  exit 2
fi
if ! apt-cache show libopenmpi3 >/dev/null 2>&1; then
  echo "gpu_bundle.sh: apt has no package lists; running apt-get update" >&2
  apt-get update -q
fi

# The recursive Depends/Pre-Depends of the runtime roots, virtual packages and exclusions skipped.
declare -A want=()
queue=("${runtime_roots[@]}")
while [ ${#queue[@]} -gt 0 ]; do
  p=${queue[0]}
  queue=("${queue[@]:1}")
  [ -n "${want[$p]:-}" ] && continue
  [[ $p =~ $exclude_re ]] && continue
  want[$p]=1
  while read -r d; do
    [ -n "$d" ] && [ -z "${want[$d]:-}" ] && queue+=("$d")
  done < <(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
             --no-replaces --no-enhances "$p" 2>/dev/null |
           sed -n 's/^ *|\{0,1\}\(Pre\)\{0,1\}Depends: \([^<][^ ]*\)$/\2/p')
done
for p in "${dev_only[@]}"; do want[$p]=1; done
mapfile -t pkgs < <(printf '%s\n' "${!want[@]}" | sort)

rm -rf "$bundle"
mkdir -p "$bundle/.work"
echo "gpu_bundle.sh: fetching ${#pkgs[@]} packages: ${pkgs[*]}"
(cd "$bundle" && apt-get download -q "${pkgs[@]}" >"$bundle/.work/download.log" 2>&1) || {
  cat "$bundle/.work/download.log" >&2; exit 1; }

# Slim each package: documentation out, the rest rebuilt under the same file name.
orig_total=0
{
  echo "# gpu_bundle/: Debian 12 packages for strata's build on the GPU machine (scripts/gpu_bundle.sh)"
  echo "# made $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(. /etc/os-release && echo "$PRETTY_NAME") $(uname -m)"
  echo "# package version original_bytes slim_bytes sha256(slim)"
} >"$bundle/MANIFEST.txt"
for deb in "$bundle"/*.deb; do
  name=$(dpkg-deb -f "$deb" Package)
  ver=$(dpkg-deb -f "$deb" Version)
  osize=$(stat -c %s "$deb")
  orig_total=$((orig_total + osize))
  tree=$bundle/.work/$name
  dpkg-deb -R "$deb" "$tree"
  rm -rf "$tree"/usr/share/{doc,man,info,lintian,locale,bug} "$tree"/usr/share/doc-base
  # The md5sums of files removed above: dpkg -x does not read them, dpkg -i would complain.
  rm -f "$tree/DEBIAN/md5sums"
  dpkg-deb -Zxz --root-owner-group -b "$tree" "$deb" >/dev/null
  rm -rf "$tree"
  echo "$name $ver $osize $(stat -c %s "$deb") $(sha256sum "$deb" | cut -d' ' -f1)" >>"$bundle/MANIFEST.txt"
done
rm -rf "$bundle/.work"

total=$(du -cb "$bundle" | tail -1 | cut -f1)
awk -v n="${#pkgs[@]}" -v o="$orig_total" -v t="$total" -v b="$bundle" 'BEGIN {
  printf "gpu_bundle.sh: %d packages, %.1f MiB as downloaded, %.1f MiB slimmed, in %s\n", n, o / 1048576, t / 1048576, b }'
echo "# total $total bytes (downloaded $orig_total)" >>"$bundle/MANIFEST.txt"
if [ "$total" -gt $((max_mib * 1048576)) ]; then
  echo "gpu_bundle.sh: the bundle is over ${max_mib} MiB: it would not travel with the working tree" >&2
  exit 1
fi
git -C "$root" check-ignore -q gpu_bundle/MANIFEST.txt ||
  echo "gpu_bundle.sh: warning: gpu_bundle/ is not git-ignored (add it to .gitignore)" >&2
