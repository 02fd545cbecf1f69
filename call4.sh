python3 -m pytest -q -m gpu -n 0 -p no:cacheprovider > $OUT/gpu-all.log 2>&1
tail -15 $OUT/gpu-all.log
