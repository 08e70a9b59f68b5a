# common set-up of a device call: optuna from the carried wheels, `python` beside python3, a stamp per step
T0=$(date +%s)
stamp() { echo "== $1 [$(( $(date +%s) - T0 )) s]"; }
left() { echo $(( ${LIMIT:-580} - ($(date +%s) - T0) )); }
VB=/opt/torch/.venv/bin
if [ -L $VB/python ] && ! $VB/python -c 1 2>/dev/null; then  # repair a python -> python3 -> python loop
  H=$(sed -n 's/^home *= *//p' /opt/torch/.venv/pyvenv.cfg); ln -sf "$H/$(ls $H | grep -E '^python3\.[0-9]+$' | head -1)" $VB/python
fi
command -v python >/dev/null || ln -s python3 "$(dirname "$(command -v python3)")/python"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
ls -l $VB/python*
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
lscpu | grep 'Model name'; python3 -c "import torch, torchvision; print(torch.__version__, torchvision.__version__)"
uptime
