# What strata needs from Debian to build and test, and the function that installs what is missing
# (sourced by scripts/setup.sh and scripts/sanitize.sh; the sanitizer runtimes, libasan and
# libubsan, come with g++). libpcre2-dev and libicu-dev: the tokenizer reader's regexes and Unicode
# normalization. libcairo2-dev and pkg-config: strata report's figures. Chromium, which
# one report test renders the page in, is installed by that test itself (it is large, and only
# that test needs it).
strata_packages=(cmake g++ make libopenmpi-dev openmpi-bin libdnnl-dev nlohmann-json3-dev
                 libcli11-dev libgtest-dev iproute2 python3 libpcre2-dev libicu-dev python3-venv
                 libprotobuf-dev protobuf-compiler libcairo2-dev pkg-config)

install_missing_packages() {
  local missing=() p
  for p in "${strata_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}"
  fi
}
